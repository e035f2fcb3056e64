"""Every on-disk and on-wire layout of Conveyor, and the defaults that go with them.

Changing a layout here changes the file format: bump the matching version number.
"""

from __future__ import annotations

import struct

# --- Message status codes (shared by memory state and the index WAL) ---------------------------
ST_READY = 0
ST_DELIVERED = 1
ST_ACKED = 2
ST_FAILED = 3
ST_DELAYED = 4  # READY but not before `until`; reported as READY (and counted as delayed)
ST_NONE = 255  # an id with no message (lost to repair, or a put torn by a crash)

# --- Defaults ----------------------------------------------------------------------------------
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_LEASE_S = 30.0
MAX_BATCH = 1_000_000  # messages per get, or items per page of results or dead letters
MAX_WAIT_S = 3600.0  # the longest a request may wait on purpose (long poll, drained wait)
MAX_DELAY_S = 1e12  # finite: a message nacked with an endless delay would never come back
MAX_LEASE_S = 7 * 24 * 3600.0  # a longer task extends its lease (a heartbeat) instead: an endless one never returns
MAX_ATTEMPTS_LIMIT = 0xFFFF  # attempts are stored as u16
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
MAX_SEGMENT_BYTES = 2**31  # offsets are stored as u32
DEFAULT_FSYNC_INTERVAL_S = 0.2
# how often a server started with stop_with_parent, or a consumer process, looks whether the
# process that started it still exists (its pipe or sentinel can be held open by a forked child)
PARENT_CHECK_S = 1.0

LOCK_NAME = "LOCK"  # flock()ed by the process that has the store open

# --- Reserved ids: ids.reserved -------------------------------------------------------------------
# No id below the reservation is ever assigned again, whatever crashed when: a put under way, or the
# idempotency keys a server writes before their messages, may have been handed them. Two slots of
# (reserved id, crc32 of it), written in turn and synced before the ids are used: a write torn by
# a crash leaves the other slot, whose value is the previous reservation (no id above it was used).
RESERVED_NAME = "ids.reserved"
RESERVED_SLOT = struct.Struct("<QI")
RESERVED_SLOT_BYTES = 16  # slot k at k * RESERVED_SLOT_BYTES
# ids reserved beyond what a put needs: one small synced write per this many ids, doubled (up to the
# most) while reservations come less than a second apart, so that a fast stream of puts syncs rarely
ID_RESERVE_CHUNK = 65536
ID_RESERVE_MOST = 1 << 20
# a server's reserve of disk space (conveyor.storage.space): a file in its data dir, given up when the
# disk fills so that deliveries and acks keep working; the smaller of these bytes and 1/DIVISOR of the disk
SPACE_RESERVE_NAME = "space.reserve"
SPACE_RESERVE_BYTES = 16 * 1024 * 1024
SPACE_RESERVE_DIVISOR = 64

# --- Log segments: seg-00000001.log -------------------------------------------------------------
SEGMENT_NAME = "seg-{:08d}.log"
SEGMENT_GLOB = "seg-*.log"
SEGMENT_MAGIC = b"CNVYSEG1"
# file header: magic, format version, segment number, id floor (every id ever assigned is below it
# when the segment is created, so ids are never reused even after compaction deleted the rest)
SEGMENT_HEADER = struct.Struct("<8sIIQ")
SEGMENT_VERSION = 1
# record: crc32(body) | size(body) | body | footer
RECORD_HEAD = struct.Struct("<II")
RECORD_FOOT = struct.Struct("<I")
RECORD_END = 0x45444E45  # b"ENDE" little-endian: marks a complete record
RECORD_OVERHEAD = RECORD_HEAD.size + RECORD_FOOT.size
# body prefix shared by every record kind: kind, message id
BODY_PREFIX = struct.Struct("<BQ")
KIND_MESSAGE = 1  # MESSAGE_PREFIX + msgpack headers (may be empty) + payload
KIND_RESULT = 2  # prefix + result bytes
KIND_DEAD = 3  # prefix + msgpack [error, failed_at, attempts, the message's KIND_MESSAGE body]
KIND_PAD = 4  # prefix + filler: a damaged span replaced by `repair=True`
# a message body's prefix: BODY_PREFIX, then fixed-size fields so that neither recovery scans nor
# reads need msgpack: kind, id, priority, max_attempts, not_before, enqueued_at, headers length
MESSAGE_PREFIX = struct.Struct("<BQiHddI")
MESSAGE_PREFIX_FIELDS = ("kind", "id", "priority", "max_attempts", "not_before", "enqueued_at", "hlen")
assert len(MESSAGE_PREFIX_FIELDS) == len(MESSAGE_PREFIX.format) - 1  # one per field of the format, in its order

# --- Index write-ahead log: index.wal ----------------------------------------------------------
INDEX_NAME = "index.wal"
INDEX_MAGIC = b"CNVYIDX1"
INDEX_VERSION = 1
# file header: magic, version, base id (all ids below are finished), next id,
# acked and failed counts of the ids below base, crc32 of the preceding fields
INDEX_HEADER = struct.Struct("<8sIQQQQI")
# record: crc32(rest) | timestamp | message id | status | flags | attempts |
#         segment, offset, length (of the message, its result or its dead letter) | until
#         (`until` is the lease deadline when DELIVERED, not-before when READY/DELAYED)
INDEX_RECORD = struct.Struct("<IdQBBHIIId")
INDEX_FIELDS = ("crc", "ts", "id", "status", "flags", "attempts", "seg", "off", "len", "until")
assert len(INDEX_FIELDS) == len(INDEX_RECORD.format) - 1  # one per field of the format, in its order
# flags: a gap record (status ST_NONE, written by a rewrite for ids below the header's base) says
# that the `length` ids from `message id` on hold no message (purged, skipped, or torn by a crash)
INDEX_FLAG_GAP = 1
# rewrite the index once it holds this many records and more than REWRITE_RATIO x the live ones
INDEX_REWRITE_MIN_RECORDS = 65536
INDEX_REWRITE_RATIO = 2

# --- Wire protocol (conveyor.protocol.framing) -----------------------------------------------------------
# A message on the wire is a frame set: FRAME_PREFIX (header length, payload frame count), one u32
# length per payload frame, the msgpack header (a map with at least "op" and "id"), then the payload
# frames back to back. Payloads are raw bytes, never re-encoded. Replies echo the request's "id".
PROTOCOL_VERSION = 1
FRAME_PREFIX = struct.Struct("<II")
FRAME_LENGTH = "<{}I"  # format of the frame length array, for n frames
DEFAULT_PORT = 7070
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024  # one payload frame
DEFAULT_MAX_HEADER_BYTES = 16 * 1024 * 1024  # per-message metadata of a large batch fits
# messages (payload frames) per request or reply: a server works one request at a time, and 65,536
# small messages take it about a quarter of a second (clients split bigger puts; replies stop here)
DEFAULT_MAX_FRAMES = 65_536
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # all payload frames of one message
# an ad-hoc function's pickle is stored on the servers as blobs of at most this many bytes (a manifest names
# them when there are several): a model in a closure travels once per consumer, each blob far under a frame
FUNCTION_CHUNK_BYTES = 16 * 1024 * 1024
FUNCTION_MAX_BYTES = 1024 * 1024 * 1024  # past this a function is refused: each server holds it, each worker loads it
FUNCTION_MANIFEST_MAGIC = b"conveyor-function-chunks/1\n"  # a pickle starts with 0x80: never taken for a manifest
# a reply of messages, results or dead letters stops growing past this many bytes (or the client's limits)
PAGE_BYTES = 16 * 1024 * 1024
REQUEST_SLACK_BYTES = 64 * 1024  # of a header limit, kept for the fields that are not per message
DEFAULT_MAX_IN_FLIGHT = 64  # requests a server runs at once per connection
DEFAULT_MAX_CONNECTIONS = 4096  # at most; fewer where the descriptor limit is low (a quarter of it)
DEFAULT_IDLE_TIMEOUT_S = 300.0  # a connection with nothing under way is closed after this much silence
DEFAULT_REQUEST_TIMEOUT_S = 120.0  # from the first byte of a request to its last
# a server's memory budget (server/budget.py): bytes it holds at once for requests being read or run
# and for replies its clients have not taken yet. The largest request the default limits let in (256
# MiB of payloads and 16 MiB of header) fits; flooded, a server stays within this, its own 50 MB and a
# margin per connection (docs/server.md): about 350 MB, which a machine of 1 GiB holds beside its OS
DEFAULT_MEMORY_BUDGET_BYTES = DEFAULT_MAX_MESSAGE_BYTES + DEFAULT_MAX_HEADER_BYTES
MIN_MEMORY_BUDGET_BYTES = 4 * 1024 * 1024  # the limits fitted to it still take a 1 MiB header and 3 MiB of frames
# each connection's first bytes are outside the budget: its pings, acks and small puts never wait for room
CONNECTION_FREE_BYTES = 1024 * 1024
# a request's payload frames are read in runs of at most this many bytes (a bigger frame alone, in
# pieces of this size): the stream's buffer never holds more, and whatever fails midway is freed at once
READ_CHUNK_BYTES = 1024 * 1024
# error kinds in a reply's "error" field
ERR_PROTOCOL = "protocol"  # malformed frames or a limit exceeded: the server closes the connection
ERR_AUTH = "auth"  # authentication failed or missing: the server closes the connection
ERR_UNKNOWN_OP = "unknown-operation"
ERR_BAD_ARGUMENT = "bad-argument"
ERR_NO_QUEUE = "no-such-queue"
ERR_QUEUE_CONFLICT = "queue-conflict"  # declared again with other settings
ERR_UNAVAILABLE = "unavailable"  # the queue's store could not be opened (damaged): see the message
ERR_STORE = "store"  # the store failed (disk full, closed)
ERR_INTERNAL = "internal"
ERR_BUSY = "busy"  # in a hello: the server takes no more connections (its limit); try again later
ERR_TOO_LARGE = "too-large"  # a message or result that does not fit in a reply within the client's limits
# authentication: HMAC-SHA256 over both sides' nonces, each side proving it knows the token
AUTH_NONCE_BYTES = 32
AUTH_CLIENT_LABEL = b"conveyor-auth-client\x00"
AUTH_SERVER_LABEL = b"conveyor-auth-server\x00"
# failed token checks, per source address (conveyor.protocol.throttle): a budget of THROTTLE_BURST
# failures that refills one per pace, the pace doubling every THROTTLE_BACKOFF_EVERY failures up to
# THROTTLE_MAX_PACE_S, all forgotten after THROTTLE_FORGET_S without one; THROTTLE_MAX_SOURCES remembered
THROTTLE_PACE_S = 0.1
THROTTLE_MAX_PACE_S = 1.0
THROTTLE_BURST = 10
THROTTLE_BACKOFF_EVERY = 100
THROTTLE_FORGET_S = 60.0
THROTTLE_MAX_SOURCES = 10_000
# queue names are directory names under a server's data dir
QUEUE_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
# store kinds a server knows (conveyor.server.store_kinds): a queue is declared with one, by name
STORE_TRANSIENT = "transient"  # in the server's memory, gone when it stops
STORE_DURABLE = "durable"  # on disk under the server's data dir, reopened when it restarts
QUEUES_DIR = "queues"  # <data dir>/queues/<name>/ holds the store of a queue kept on disk
QUEUE_CONFIG_NAME = "queue.json"  # a durable queue's settings, beside its store files
SERVER_LOCK_NAME = "SERVER.lock"
# {"next_id": n}: every queue dropped so far used only ids below n; a queue created after starts at n,
# so an ack meant for a dropped queue's message never finishes a message of its successor
ID_FLOOR_NAME = "id-floor.json"
DROPPING_PREFIX = ".dropping-"  # a dropped queue's directory is renamed so before it is removed
KEYS_LOG_NAME = "keys.log"  # a durable queue's idempotency keys (conveyor.server.idempotency), beside its store
DEDUPE_MAX_KEYS = 1_000_000  # idempotency keys a queue remembers (the most recent)
MAX_KEY_BYTES = 1024
BLOB_DIR = "blobs"  # content-addressed blobs (sha256 hex names), e.g. pickled functions
# a pool folds its shard number into message ids: global id = shard << SHARD_SHIFT | local id
SHARD_SHIFT = 48

# =========================================================================================
# --- Tasks: envelopes, results and task message headers (serialization.py, tasks.py) -----------
# A task message's payload is an envelope; its headers let a consumer route and limit the task
# without decoding the payload. Header names are short: they travel with every message.
ENVELOPE_VERSION = 1
# msgpack envelope: array [ENVELOPE_VERSION, task name, args (array), kwargs (map), app_data (map|nil)]
# pickle envelope: cloudpickle of the tuple (ENVELOPE_VERSION, task name, args, kwargs, app_data)
H_CONTENT_TYPE = "ct"  # how the payload is encoded: CT_MSGPACK or CT_PICKLE
CT_MSGPACK = "msgpack"
CT_PICKLE = "pickle"
H_TASK = "task"  # the task name (also inside the envelope)
H_TIME_LIMIT = "tl"  # the task's time limit in seconds (repr of a float); absent: no limit
H_RETRY_BACKOFF = "rb"  # "base,factor,cap,jitter" (see options.Backoff); absent: the default backoff
H_IDEMPOTENCY_KEY = "key"  # publish(_key=...): a producer's idempotency key, honoured by the server
H_ROWS = "rows"  # a conveyor.spark.map message: how many rows it carries (its consumer reports them: COUNT_ROWS)
# an ad-hoc callable's task name: this prefix + the sha256 hex digest of its cloudpickled bytes
ADHOC_TASK_PREFIX = "fn:"
MSGPACK_EXT_TUPLE = 1  # msgpack ext type: a tuple (body: the msgpack array of its items)
MSGPACK_MAX_DEPTH = 100  # deeper containers go as pickle
INT64_MIN = -(2**63)
UINT64_MAX = 2**64 - 1  # msgpack ints span INT64_MIN..UINT64_MAX
PICKLE_PROTOCOL = 5
# an encoded result is one tag byte, then the msgpack or pickle bytes
RESULT_TAG_MSGPACK = 0x01
RESULT_TAG_PICKLE = 0x02
# an error's text (type, message, traceback) kept with a nack or a dead letter: a longer one keeps its
# start and its end (it travels in a request header, and a million-line message helps no one)
MAX_ERROR_CHARS = 64 * 1024
CANCELLED_ERROR = "cancelled before it ran"  # the error of a message the `cancel` operation made a dead letter
# task option defaults
DEFAULT_QUEUE = "default"
DEFAULT_MAX_RETRIES = 3
DEFAULT_CONCURRENCY = 8  # tasks one consumer runs at once
# a thread-mode consumer whose concurrency is left out starts DEFAULT_CONCURRENCY threads and, after each
# IO_LOOK_S in which all were busy (at IO_FULL_SHARE of its sweeps), grows them by as many times as keeps its
# process's CPU under IO_BUSY_CORES of a core (at least 2, at most IO_MAX_GROWTH times a look, up to
# IO_MAX_THREADS): its tasks wait (on sockets, sleeps), and more of them at once finish sooner; the GIL gives
# Python threads a core at most (worker/thread_scaling.py). CPU-bound tasks keep a core busy: never grown.
IO_LOOK_S = 0.5
IO_FULL_SHARE = 0.75
IO_BUSY_CORES = 0.5
IO_MAX_GROWTH = 4
IO_MAX_THREADS = 128
# calls one consumer with pool="async" has in flight: its tasks wait on I/O (web APIs, models behind a
# server), so hundreds overlap where 8 would leave it idle; each call may hold a socket, and 256 keeps a
# consumer well under the common limit of 1,024 open descriptors (and a server's patience with one client)
DEFAULT_ASYNC_CONCURRENCY = 256
# plain (sync) tasks given to pool="async" run in threads of their own, at most this many (and at most
# `concurrency`): as a thread pool's default, not one thread per call in flight
ASYNC_PLAIN_THREADS = DEFAULT_CONCURRENCY
# most async slots a busy consumer leaves idle while it waits to fetch a batch: half a batch of hundreds of
# calls in flight would leave half of them idle, and 32 messages a fetch already spread its round trip thin
REFILL_MAX = 32
# a thread-mode consumer holds, beyond its slots, the messages it finishes in this long at its pace
# (worker/pacing.py), at most READ_AHEAD_MAX: quick tasks come in large fetches, long ones one by one.
# Measured on the skewed workload (5 ms tasks on average): a window of 0.05 s made ~100 fetches per
# server per 1,000 tasks, 0.2 s half as many, and the servers' CPU, taken from the cores the tasks
# run on, fell from 0.17 s to 0.11 s each
READ_AHEAD_WINDOW_S = 0.2
READ_AHEAD_MAX = 2000
# conveyor.spark.map: the queue's lease. A running message's lease is extended every third of it (a
# heartbeat), so a short lease costs a few requests and brings back the rows of a lost host quickly.
MAP_DEFAULT_LEASE_S = 10.0
# how long a queue server may be out of reach before the consumers, joins and maps that need it fail
# with ServerUnreachableError (a server started again on its data dir within it: the work goes on)
DEFAULT_UNREACHABLE_S = 30.0
# after a server fails to answer a get, a pool's gets serve the others for a quarter of how long it has
# been out of reach, at least SHARD_DOWN_S and at most SHARD_DOWN_MAX_S, then try it again
SHARD_DOWN_S, SHARD_DOWN_MAX_S = 2.0, 10.0
# a consumer says which servers are out of reach when it notices, then this often while they are
OUT_OF_REACH_SAY_S = 60.0
# on SIGTERM or Ctrl-C (`conveyor worker --shutdown-timeout`, ConsumerPool.cancel): how long running tasks
# may take to finish; those still running then are handed back (released, the attempt not counted)
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# a join, gather or result() waiting on a queue no live consumer serves warns after STALL_FIRST_S (time
# for consumers just started to report), then every STALL_WARN_S while it lasts; it asks the servers
# which consumers report at most every STALL_LOOK_S
STALL_FIRST_S = 5.0
STALL_WARN_S = 30.0
STALL_LOOK_S = 2.0
# the queues Conveyor keeps for itself, not the user's work, start with this: a Spark job's records
# (conveyor.spark.records: conveyor-fed-<job>, the rows each task put; conveyor-read-<run>, what each read task
# read). The dashboard leaves them out unless asked; a user's queue named so is taken for one
INTERNAL_QUEUE_PREFIX = "conveyor-"
MAP_DEFAULT_ROWS_PER_MESSAGE = 8  # conveyor.spark.map without a time limit (with one: 1)
MAP_BATCHES_DEFAULT_ROWS = 1024  # conveyor.spark.map_batches: the input rows of one batch (one message, one call of fn)
# map_batches' bytes, well under DEFAULT_MAX_FRAME_BYTES: a batch's input rows as Arrow (cut smaller to fit; a
# single row over it fails alone), and its result (over it, its rows fail saying so)
MAP_BATCHES_MAX_BYTES = 16 * 1024 * 1024
MAP_BATCHES_MAX_RESULT_BYTES = 32 * 1024 * 1024
# a map or map_batches task's result (conveyor.spark.rows, conveyor.spark.batch_form), a msgpack list: [its rows
# (map: a list of outcomes; map_batches: Arrow IPC bytes), the instances of fn's class built since the last result]
JOB_RESULT_ROWS, JOB_RESULT_BUILT = 0, 1
# one of map's outcomes, a list: [ok, the output row or the error text, the input row as JSON or None, the
# idempotency key of the split message the row ran in or ""]
OUTCOME_OK, OUTCOME_VALUE, OUTCOME_INPUT, OUTCOME_KEY = 0, 1, 2, 3
INPUT_MAX_CHARS = 2048  # a failed row's `_input` (map, map_batches): longer, each value is cut to its share of it
DEFAULT_BACKOFF_BASE_S = 1.0
DEFAULT_BACKOFF_FACTOR = 2.0
DEFAULT_BACKOFF_CAP_S = 300.0

# --- Workers: queue configuration and settings (worker/settings.py, worker/selectors.py) --------
# the log lines of `conveyor` and of the processes it starts (consumers, task processes): dated, as Celery's
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SETTINGS_ENV = "CONVEYOR_SETTINGS_MODULE"  # names the settings module, like ndkale's KALE_SETTINGS_MODULE
DEFAULT_SELECTOR = "ReducedLottery"
LOTTERY_PRIORITY_MIN = 1  # a queue takes part in a lottery only with a priority in 1..100 (ndkale)
LOTTERY_PRIORITY_MAX = 100
LOTTERY_LOTTERY_DRAWS = 10  # LotteryLottery: draws before settling for any queue (ndkale: 10)
# a queue's defaults when its YAML entry leaves a field out (ndkale's TaskQueue defaults)
QUEUE_DEFAULT_PRIORITY = 5
QUEUE_DEFAULT_VISIBILITY_TIMEOUT_S = 600.0
QUEUE_DEFAULT_LONG_POLL_S = 5.0
QUEUE_DEFAULT_NUM_ITERATIONS = 2
# a consumer reports its counts (REPORT_EVERY_S in worker/consumer.py: every 2 s) to every server; one
# not heard from for this long (several missed reports) is gone: out of `workers()` and `conveyor stats`
WORKER_GONE_S = 10.0
# a consumer's report: its fields are declared in conveyor.protocol.report; its prefixed keys here.
# Each queue a consumer serves: COUNT_SERVES + the queue's name, 1 (a wait on a queue none serves says so)
COUNT_SERVES = "serves:"
MAX_HOST_CHARS = 255
# a consumer's task run times travel in its report as a histogram: per bucket, the number of tasks
# that took at most its upper bound in seconds (not cumulative; key COUNT_TASK_SECONDS_LE + the bound,
# "inf" for the last), and their total seconds under COUNT_TASK_SECONDS_SUM
COUNT_TASK_SECONDS_LE = "task_seconds_le_"
COUNT_TASK_SECONDS_SUM = "task_seconds_sum"
# per queue whose messages carry H_ROWS (a map job's): the rows of the messages the consumer settled
# (acked, or failed for good) under COUNT_ROWS + the queue name, and those messages under COUNT_ROW_MESSAGES + it
COUNT_ROWS = "rows:"
COUNT_ROW_MESSAGES = "row_messages:"
TASK_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 1800.0)

# --- Metrics (server/metrics.py: `conveyor serve --metrics-port`) -------------------------------
METRICS_PATH = "/metrics"
# a request's time in the server, from its frames read to its reply queued (a get's wait included)
REQUEST_SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

# --- Task records (server/task_records.py: the `tasks` and `task` operations, `conveyor inspect`) --
# per queue, in memory: the deliveries running (bounded by the leases) and the last TASK_RECENT finished
TASK_RECENT = 1000
TASK_PREVIEW_BYTES = 512  # of a message's payload (and of a stored result) kept and sent as a preview
TASK_ERROR_KEPT_CHARS = 2048  # of a failed delivery's error: its start and its end (a dead letter keeps it whole)
TASK_ERROR_SUMMARY_CHARS = 200  # of that error, in a page of records (the line that names it)
TASK_PAGE_MAX = 1000  # records of each kind (running, recent) one `tasks` request may ask for
TASK_HISTORY_MAX = 100  # the newest deliveries of one message a `task` answer holds
MAX_CONSUMER_CHARS = 200  # of a consumer's name, as a server keeps it (its reports, its deliveries)
# metrics: the task names with a `task` label of their own (the most run since the server started;
# the rest count as TASK_LABEL_OTHER), among at most TASK_NAMES_TRACKED names tallied
TASK_LABELS = 10
TASK_LABEL_OTHER = "other"
TASK_NAMES_TRACKED = 1000
