-- The log alone. kv_head was the one structure a write still touched in key order: an update
-- dirtied a page of it somewhere in the file, and SQLite logs and checkpoints whole pages
-- (about a third of a write's disk bytes and a tenth of its throughput; BENCHMARKS.md, "What
-- the storage layout still costs"). kv_replaced only repeated what each row's prev_revision
-- says. The process's in-memory index holds every key and each key's recent changes (by
-- default back to the compact revision, up to a million changes); it is built at start by
-- reading the log in revision order, and it answers the reads by key. What still reads SQL
-- finds each key's newest row by reading the log.
DROP TABLE kv_head;
DROP TABLE kv_replaced;
