"""The layouts of a TaskGraph's data in Spark: the rows that carry Arrow batches between nodes, and their sizes.

Every edge of a TaskGraph moves Arrow batches as rows of a Spark DataFrame; each row holds one
batch serialised as an Arrow IPC stream (schema + one or more record batches), its buffers
compressed with `IPC_COMPRESSION`.
"""

from __future__ import annotations

import pyarrow as pa

MiB = 1024 * 1024

# A routed batch, as emitted by a producer node: the consumer edge it travels on (the graph's edge
# number), the consumer channel it is for (= the consumer's Spark partition), the producer's
# dependency level (build sides sort before probe sides), its sequence number within the edge, and
# the batch. Consumers sort by (channel, level, seq, edge).
ROUTE_DDL = "edge INT, channel INT, level INT, seq BIGINT, batch BINARY"
ROUTE_SCHEMA = pa.schema(
    [("edge", pa.int32()), ("channel", pa.int32()), ("level", pa.int32()), ("seq", pa.int64()), ("batch", pa.binary())]
)
# A Dataset (a blocking node's materialised output): the channel that produced the batch, its
# sequence number within the channel, the batch. Also the layout of a Dataset checkpointed as Parquet.
DATASET_DDL = "channel INT, seq BIGINT, batch BINARY"
DATASET_SCHEMA = pa.schema([("channel", pa.int32()), ("seq", pa.int64()), ("batch", pa.binary())])
# The compression of the batches' buffers. The JVM copies every routed row several times (Arrow to
# its rows, the shuffle files, the consumer's sort, which spills what its memory cannot hold, Arrow
# again): lz4 halves the bytes of typical batches (TPC-H lineitem's keys and prices: 240 MB to 109 MB)
# for ~0.1 s more per 240 MB to encode and as much to decode, and the JVM's work shrinks with them
# (Quokka's Q8 on Parquet at SF1: a quarter less time).
IPC_COMPRESSION = "lz4"
# seq = (producer channel or input split) << SEQ_SHIFT | batch number within it
SEQ_SHIFT = 32
# a batch bigger than this is cut into slices before it is routed (keeps rows of the shuffle small)
BATCH_MAX_BYTES = 16 * MiB
# a producer flushes a RecordBatch of routed rows to Spark once it holds this many payload bytes
FLUSH_BYTES = 32 * MiB
# bytes per Arrow batch handed to a node's Python task while a graph runs
# (spark.sql.execution.arrow.maxBytesPerBatch): the row limit alone (10,000 rows) would put
# gigabytes of batches in one Arrow batch, and lowering it would starve Spark-read inputs
ARROW_BATCH_BYTES = 64 * MiB
# CSV inputs: the bytes per read split unless the node says otherwise (`stride`)
CSV_STRIDE_BYTES = 64 * MiB
# CSV inputs: the column types are inferred from this many bytes at the start of the first file
CSV_SAMPLE_BYTES = 1 * MiB
# CSV inputs: bytes per parsed block (one block = one batch read)
CSV_BLOCK_BYTES = 4 * MiB
# Parquet inputs: rows per batch read, the row groups a channel reads in turn merged up to it (and to
# BATCH_MAX_BYTES): the work downstream is per batch (Quokka's Q3 and Q12 on TPC-H's row groups of
# 120 Ki rows: a batch function, a join and an aggregation per batch)
PARQUET_BATCH_ROWS = 512 * 1024
# Parquet inputs: a string column whose chunks all have a dictionary page of at most this many bytes is
# read as a dictionary and decoded after the input's filter (TPC-H lineitem's ship modes: 0.71 s to 0.12 s
# per 6 M rows read, one core)
DICTIONARY_PAGE_BYTES = 64 * 1024
