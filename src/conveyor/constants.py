"""Every on-disk and on-wire layout of Conveyor, and the defaults that go with them.

Changing a layout here changes the file format: bump the matching version number.
"""

from __future__ import annotations

import struct

import numpy as np

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
MAX_ATTEMPTS_LIMIT = 0xFFFF  # attempts are stored as u16
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
MAX_SEGMENT_BYTES = 2**31  # offsets are stored as u32
DEFAULT_FSYNC_INTERVAL_S = 0.2

LOCK_NAME = "LOCK"  # flock()ed by the process that has the store open

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
MESSAGE_PREFIX_DTYPE = np.dtype(
    [("kind", "u1"), ("id", "<u8"), ("priority", "<i4"), ("max_attempts", "<u2"), ("not_before", "<f8"),
     ("enqueued_at", "<f8"), ("hlen", "<u4")]
)  # fmt: skip
assert MESSAGE_PREFIX_DTYPE.itemsize == MESSAGE_PREFIX.size

# --- Index write-ahead log: index.wal ----------------------------------------------------------
INDEX_NAME = "index.wal"
INDEX_MAGIC = b"CNVYIDX1"
INDEX_VERSION = 1
# file header: magic, version, base id (all ids below are finished), next id,
# acked and failed counts of the ids below base, crc32 of the preceding fields
INDEX_HEADER = struct.Struct("<8sIQQQQI")
# record: crc32(rest) | timestamp | message id | status | pad | attempts |
#         segment, offset, length (of the message, its result or its dead letter) | until
#         (`until` is the lease deadline when DELIVERED, not-before when READY/DELAYED)
INDEX_RECORD = struct.Struct("<IdQBBHIIId")
INDEX_DTYPE = np.dtype(
    [
        ("crc", "<u4"),
        ("ts", "<f8"),
        ("id", "<u8"),
        ("status", "u1"),
        ("pad", "u1"),
        ("attempts", "<u2"),
        ("seg", "<u4"),
        ("off", "<u4"),
        ("len", "<u4"),
        ("until", "<f8"),
    ]
)
assert INDEX_DTYPE.itemsize == INDEX_RECORD.size
# rewrite the index once it holds this many records and more than REWRITE_RATIO x the live ones
INDEX_REWRITE_MIN_RECORDS = 65536
INDEX_REWRITE_RATIO = 2

# =================================================================================================
# --- TaskGraph on Spark (conveyor.spark): the rows that carry Arrow batches between nodes ---------
# =================================================================================================
# Every edge of a TaskGraph moves Arrow batches as rows of a Spark DataFrame; each row holds one
# batch serialised as an Arrow IPC stream (schema + one or more record batches, uncompressed: Spark
# compresses its shuffle files itself).
#
# A routed batch, as emitted by a producer node: the consumer edge it travels on (the graph's edge
# number), the consumer channel it is for (= the consumer's Spark partition), the producer's
# dependency level (build sides sort before probe sides), its sequence number within the edge, and
# the batch. Consumers sort by (channel, level, seq, edge).
GRAPH_ROUTE_DDL = "edge INT, channel INT, level INT, seq BIGINT, batch BINARY"
GRAPH_ROUTE_COLUMNS = ("edge", "channel", "level", "seq", "batch")
# A Dataset (a blocking node's materialised output): the channel that produced the batch, its
# sequence number within the channel, the batch. Also the layout of a Dataset checkpointed as Parquet.
GRAPH_DATASET_DDL = "channel INT, seq BIGINT, batch BINARY"
GRAPH_DATASET_COLUMNS = ("channel", "seq", "batch")
# seq = (producer channel or input split) << GRAPH_SEQ_SHIFT | batch number within it
GRAPH_SEQ_SHIFT = 32
# a batch bigger than this is cut into slices before it is routed (keeps rows of the shuffle small)
GRAPH_BATCH_MAX_BYTES = 16 * 1024 * 1024
# a producer flushes a RecordBatch of routed rows to Spark once it holds this many payload bytes
GRAPH_FLUSH_BYTES = 32 * 1024 * 1024
# bytes per Arrow batch handed to a node's Python task while a graph runs
# (spark.sql.execution.arrow.maxBytesPerBatch): the row limit alone (10,000 rows) would put
# gigabytes of batches in one Arrow batch, and lowering it would starve Spark-read inputs
GRAPH_ARROW_BATCH_BYTES = 64 * 1024 * 1024
# CSV inputs: the column types are inferred from this many bytes at the start of the first file
GRAPH_CSV_SAMPLE_BYTES = 1024 * 1024
# CSV inputs: bytes per parsed block (one block = one batch read)
GRAPH_CSV_BLOCK_BYTES = 4 * 1024 * 1024
# Parquet inputs: rows per batch read
GRAPH_PARQUET_BATCH_ROWS = 128 * 1024
