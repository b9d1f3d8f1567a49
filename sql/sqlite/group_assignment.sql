-- group_assignment: the assignment of partitions 0 .. :partitions - 1 to the live
-- members of group :grp (contract: group_assignment).
--
-- A read: runs in autocommit. Parameters (named):
--   :grp         TEXT
--   :partitions  INTEGER, 1 to 1024 (check it yourself)
-- Result: rows (part INTEGER, member TEXT), ordered by part; no row when the group
-- has no live member. Bounded-load rendezvous hashing, exactly as the PostgreSQL
-- function computes it (docs/sql.md gives the hash): with n members, q and r the
-- quotient and remainder of :partitions by n, the (member, partition) pairs are
-- taken by score, highest first (then by member, then by partition), and a
-- partition goes to the member of its pair while it has none and the member has
-- fewer than q, or q while fewer than r members have q + 1. XOR is written
-- (a | b) - (a & b); every product stays below 2^63.
WITH RECURSIVE
clock(now) AS (SELECT round((julianday('now') - 2440587.5) * 86400.0, 3)),
-- The live members, numbered from 1 in the order of their UTF-8 bytes.
live(i, member, bytes) AS MATERIALIZED (
    SELECT row_number() OVER (ORDER BY m.member), m.member, hex(CAST(m.member AS BLOB))
      FROM pylease_members AS m, clock
     WHERE m.grp = :grp AND m.expires_at > clock.now
),
offsets(at) AS (
    SELECT 0
    UNION ALL
    SELECT at + 1 FROM offsets WHERE at + 1 < (SELECT max(length(bytes)) / 2 FROM live)
),
octets(i, at, v) AS MATERIALIZED (
    SELECT l.i, o.at,
           (instr('0123456789ABCDEF', substr(l.bytes, 2 * o.at + 1, 1)) - 1) * 16
           + instr('0123456789ABCDEF', substr(l.bytes, 2 * o.at + 2, 1)) - 1
      FROM live AS l JOIN offsets AS o ON o.at < length(l.bytes) / 2
),
-- FNV-1a (32 bits) of each member's bytes.
fnv(i, at, h) AS (
    SELECT i, 0, 2166136261 FROM live
    UNION ALL
    SELECT f.i, f.at + 1, (((f.h | b.v) - (f.h & b.v)) * 16777619) & 4294967295
      FROM fnv AS f JOIN octets AS b ON b.i = f.i AND b.at = f.at
),
hashes(i, h) AS MATERIALIZED (
    SELECT f.i, f.h FROM fnv AS f JOIN live AS l ON l.i = f.i WHERE f.at = length(l.bytes) / 2
),
parts(p) AS (SELECT 0 UNION ALL SELECT p + 1 FROM parts WHERE p + 1 < :partitions),
-- score(member, p): FNV-1a continued over p's 4 bytes (big-endian), then h ^= h >> 16,
-- h *= 0x21f0aaad, h ^= h >> 15, h *= 0x735a2d97, h ^= h >> 15. Each stage is
-- materialized, so that the next one reads its value instead of copying its formula.
high(p, i, h) AS MATERIALIZED (
    SELECT p, i, (((t | ((p >> 16) & 255)) - (t & ((p >> 16) & 255))) * 16777619) & 4294967295
      FROM (SELECT p.p AS p, x.i AS i,
                   (((x.h | (p.p >> 24)) - (x.h & (p.p >> 24))) * 16777619) & 4294967295 AS t
              FROM parts AS p, hashes AS x)
),
low(p, i, h) AS MATERIALIZED (
    SELECT p, i, (((t | (p & 255)) - (t & (p & 255))) * 16777619) & 4294967295
      FROM (SELECT p, i,
                   (((h | ((p >> 8) & 255)) - (h & ((p >> 8) & 255))) * 16777619) & 4294967295 AS t
              FROM high)
),
mixed(p, i, h) AS MATERIALIZED (
    SELECT p, i, (((h | (h >> 16)) - (h & (h >> 16))) * 569420461) & 4294967295 FROM low
),
remixed(p, i, h) AS MATERIALIZED (
    SELECT p, i, (((h | (h >> 15)) - (h & (h >> 15))) * 1935289751) & 4294967295 FROM mixed
),
pairs(k, p, i) AS MATERIALIZED (
    SELECT row_number() OVER (ORDER BY (h | (h >> 15)) - (h & (h >> 15)) DESC, i, p), p, i
      FROM remixed
),
shares(n, q, r) AS (
    SELECT count(*), :partitions / count(*), :partitions % count(*) FROM live
),
-- One pair a step, in order: its partition goes to its member (took) when it has no
-- member yet and the member has room. taken: a digit per partition (1: placed);
-- loads: 4 digits per member; extra: how many members have q + 1.
taking(k, p, i, took, taken, loads, extra, placed) AS (
    SELECT 0, NULL, NULL, 0, replace(hex(zeroblob(:partitions)), '00', '0'),
           hex(zeroblob(2 * n)), 0, 0
      FROM shares WHERE n > 0
    UNION ALL
    SELECT x.k, x.p, x.i,
           substr(s.taken, x.p + 1, 1) = '0'
           AND CAST(substr(s.loads, 4 * x.i - 3, 4) AS INTEGER) < c.q + (s.extra < c.r),
           CASE WHEN substr(s.taken, x.p + 1, 1) = '0'
                 AND CAST(substr(s.loads, 4 * x.i - 3, 4) AS INTEGER) < c.q + (s.extra < c.r)
                THEN substr(s.taken, 1, x.p) || '1' || substr(s.taken, x.p + 2)
                ELSE s.taken END,
           CASE WHEN substr(s.taken, x.p + 1, 1) = '0'
                 AND CAST(substr(s.loads, 4 * x.i - 3, 4) AS INTEGER) < c.q + (s.extra < c.r)
                THEN substr(s.loads, 1, 4 * x.i - 4)
                     || printf('%04d', CAST(substr(s.loads, 4 * x.i - 3, 4) AS INTEGER) + 1)
                     || substr(s.loads, 4 * x.i + 1)
                ELSE s.loads END,
           s.extra + (substr(s.taken, x.p + 1, 1) = '0'
                      AND CAST(substr(s.loads, 4 * x.i - 3, 4) AS INTEGER) = c.q
                      AND s.extra < c.r),
           s.placed + (substr(s.taken, x.p + 1, 1) = '0'
                       AND CAST(substr(s.loads, 4 * x.i - 3, 4) AS INTEGER) < c.q + (s.extra < c.r))
      FROM taking AS s JOIN pairs AS x ON x.k = s.k + 1, shares AS c
     WHERE s.placed < :partitions
)
SELECT t.p AS part, l.member
  FROM taking AS t JOIN live AS l ON l.i = t.i
 WHERE t.took
 ORDER BY t.p;
