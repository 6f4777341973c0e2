-- The batch that last moved the current revision, as the writer that sent it named it (NULL: a
-- writer that does not name its batches). A writer may send a batch before the one it follows
-- has answered: that batch writes only if the current revision is where the one before left it
-- and carries its name, which only that batch's own commit puts there. See src/mvcc/writer.rs.
ALTER TABLE meta ADD COLUMN last_batch BIGINT;
