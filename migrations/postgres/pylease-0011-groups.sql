-- pylease 0011: groups, membership and partitions (contract revision 3, section 5.5;
-- issue 27). Keep sql/postgres/schema.sql in step.
--   * pylease_groups: one row per group ever joined, with the last incarnation it
--     issued, so that incarnations never go back though members' rows are deleted;
--   * pylease_members: one row per member name of a group, live or gone (a gone
--     member's row stays until the group's next join deletes it);
--   * group_join, group_renew, group_leave, group_members, member_holds and
--     group_assignment; group_renew and group_leave also take the incarnation they
--     mean; pylease_assignment, the pure function behind group_assignment.
-- Members are not leases: the partition leases ("<grp>#<part>") are.
-- depends: pylease-0010-prune

DO $pin$
BEGIN
    IF current_schema() IS NULL THEN
        RAISE EXCEPTION 'pylease: no schema of the search_path exists; create it first';
    END IF;
    PERFORM set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true);
END
$pin$;

-- Tables ----------------------------------------------------------------------

-- One row per group ever joined: the last incarnation it issued. Joins of a group
-- take turns on this row. A group name leaves room in a lease name for "#<part>".
CREATE TABLE pylease_groups (
    grp         text   PRIMARY KEY CHECK (length(grp) BETWEEN 1 AND 190),
    incarnation bigint NOT NULL DEFAULT 0 CHECK (incarnation >= 0)
);

COMMENT ON TABLE pylease_groups IS
    'pylease: one row per group, with the last incarnation it issued; written only through the group_* functions.';

-- One row per member name of a group. A member is live while expires_at is ahead
-- (a leave sets it to the moment of the leave). As for leases, the incarnation is a
-- key column (pylease_members_incarnation), so member_holds' FOR KEY SHARE conflicts
-- with a new join of the name, and renewals are HOT updates.
CREATE TABLE pylease_members (
    grp         text        NOT NULL,
    member      text        NOT NULL CHECK (length(member) BETWEEN 1 AND 200),
    incarnation bigint      NOT NULL CHECK (incarnation > 0),
    ttl         interval    NOT NULL,
    joined_at   timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    data        jsonb,
    PRIMARY KEY (grp, member)
) WITH (fillfactor = 50);
CREATE UNIQUE INDEX pylease_members_incarnation ON pylease_members (grp, member, incarnation);

COMMENT ON TABLE pylease_members IS
    'pylease: one row per member of a group; written only through the group_* functions.';

-- Checks ----------------------------------------------------------------------

-- Raises 22023 unless a group name is a non-empty text of at most 190 characters.
CREATE FUNCTION pylease_check_group(value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION 'pylease: grp must not be NULL' USING ERRCODE = '22023', COLUMN = 'grp';
    ELSIF value = '' THEN
        RAISE EXCEPTION 'pylease: grp must not be empty' USING ERRCODE = '22023', COLUMN = 'grp';
    ELSIF length(value) > 190 THEN
        RAISE EXCEPTION 'pylease: grp must be at most 190 characters'
            USING ERRCODE = '22023', COLUMN = 'grp';
    END IF;
END
$$;

-- Raises 22023 unless a member's data is at most 8192 characters as JSON text.
CREATE FUNCTION pylease_check_data(value jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
BEGIN
    IF length(value::text) > 8192 THEN
        RAISE EXCEPTION 'pylease: data must be at most 8192 characters as JSON text'
            USING ERRCODE = '22023', COLUMN = 'data';
    END IF;
END
$$;

-- Groups ----------------------------------------------------------------------

-- Join a group as member: its incarnation, larger than any the group issued (and
-- floored by the timeline, as a fence), or NULL when that member name is live (a
-- join is not idempotent: a name is one incarnation at a time). A busy join is
-- answered by one read (no row lock, no WAL). Joins of one group take turns on the
-- group's row, without a bound; the name's previous incarnation, if a fenced
-- transaction (member_holds) still holds it, is waited for at most lock_timeout, and
-- then the join is busy. A join deletes the rows of the group's gone members and
-- sends NOTIFY pylease with the group's name.
CREATE FUNCTION group_join(grp text, member text, ttl interval, data jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET lock_timeout = '2s' AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz := clock_timestamp();
    s_last  bigint;
    granted bigint;
BEGIN
    IF group_join.grp IS NULL OR group_join.grp = '' OR length(group_join.grp) > 190
       OR group_join.member IS NULL OR group_join.member = '' OR length(group_join.member) > 200
       OR group_join.ttl IS NULL OR NOT isfinite(group_join.ttl)
       OR group_join.ttl <= interval '0' OR group_join.ttl > interval '366 days'
       OR length(group_join.data::text) > 8192
       OR current_setting('transaction_read_only') = 'on'
    THEN
        PERFORM pylease_check_group(group_join.grp);
        PERFORM pylease_check_key('member', group_join.member);
        PERFORM pylease_check_ttl('ttl', group_join.ttl);
        PERFORM pylease_check_data(group_join.data);
        IF pg_is_in_recovery() THEN
            PERFORM pylease_refuse_standby('group_join');
        END IF;
        PERFORM pylease_refuse_read_only('group_join');
    END IF;

    IF EXISTS (SELECT FROM pylease_members AS m
                WHERE m.grp = group_join.grp AND m.member = group_join.member
                  AND m.expires_at > t_now) THEN
        RETURN NULL;
    END IF;

    -- Another join of the group commits in a moment (unless a caller keeps its
    -- transaction open): wait for it, never call the group busy.
    PERFORM set_config('lock_timeout', '0', true);
    LOOP
        SELECT g.incarnation INTO s_last FROM pylease_groups AS g
         WHERE g.grp = group_join.grp
           FOR NO KEY UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO pylease_groups AS g (grp) VALUES (group_join.grp) ON CONFLICT DO NOTHING;
    END LOOP;
    IF s_last = 9223372036854775807 THEN
        RAISE EXCEPTION 'pylease: group % has used every incarnation (%): nobody can join it again',
            quote_literal(group_join.grp), s_last USING ERRCODE = '54000';
    END IF;

    PERFORM set_config('lock_timeout', '2s', true);
    BEGIN
        -- The name's row, when it has one, is gone (left or expired) unless another
        -- join of it committed since the read above: then nothing changes.
        WITH made AS (
            INSERT INTO pylease_members AS m (grp, member, incarnation, ttl, joined_at,
                                              renewed_at, expires_at, data)
            VALUES (group_join.grp, group_join.member,
                    greatest(s_last + 1,
                        ((('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::bigint - 1) << 40) + 1),
                    group_join.ttl, t_now, t_now, t_now + group_join.ttl, group_join.data)
            ON CONFLICT (grp, member) DO UPDATE
               SET incarnation = excluded.incarnation,
                   ttl         = excluded.ttl,
                   joined_at   = excluded.joined_at,
                   renewed_at  = excluded.renewed_at,
                   expires_at  = excluded.expires_at,
                   data        = excluded.data
             WHERE m.expires_at <= excluded.joined_at
            RETURNING m.incarnation
        )
        UPDATE pylease_groups AS g SET incarnation = k.incarnation
          FROM made AS k
         WHERE g.grp = group_join.grp
        RETURNING k.incarnation INTO granted;
    EXCEPTION WHEN lock_not_available THEN
        -- The previous incarnation's fenced transaction is still open: not ours yet.
        RETURN NULL;
    END;
    IF granted IS NULL THEN
        RETURN NULL;
    END IF;

    -- The gone members' rows; a row a fenced transaction holds is left for later.
    DELETE FROM pylease_members AS m
     WHERE m.grp = group_join.grp
       AND m.member IN (SELECT d.member FROM pylease_members AS d
                         WHERE d.grp = group_join.grp AND d.expires_at <= t_now
                           FOR UPDATE SKIP LOCKED);
    PERFORM pg_notify('pylease', group_join.grp);
    RETURN granted;
END
$$;

-- Renew a live member, never earlier: true when it was live (and the incarnation
-- given, if not NULL, is its). Unlike a lease, a member past its expiry is not
-- renewed: the others have seen it leave, and it must join again.
CREATE FUNCTION group_renew(grp text, member text, ttl interval, incarnation bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now timestamptz := clock_timestamp();
BEGIN
    IF group_renew.grp IS NULL OR group_renew.grp = '' OR length(group_renew.grp) > 190
       OR group_renew.member IS NULL OR group_renew.member = ''
       OR length(group_renew.member) > 200
       OR NOT isfinite(group_renew.ttl)
       OR group_renew.ttl <= interval '0' OR group_renew.ttl > interval '366 days'
    THEN
        PERFORM pylease_check_group(group_renew.grp);
        PERFORM pylease_check_key('member', group_renew.member);
        IF group_renew.ttl IS NOT NULL THEN
            PERFORM pylease_check_ttl('ttl', group_renew.ttl);
        END IF;
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pylease_refuse_standby('group_renew');
    END IF;

    UPDATE pylease_members AS m
       SET ttl        = coalesce(group_renew.ttl, m.ttl),
           renewed_at = t_now,
           expires_at = greatest(m.expires_at, t_now + coalesce(group_renew.ttl, m.ttl))
     WHERE m.grp = group_renew.grp AND m.member = group_renew.member AND m.expires_at > t_now
       AND (group_renew.incarnation IS NULL OR m.incarnation = group_renew.incarnation);
    RETURN FOUND;
END
$$;

-- Renew a live member, whichever incarnation it is.
CREATE FUNCTION group_renew(grp text, member text, ttl interval DEFAULT NULL) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT group_renew($1, $2, $3, NULL::bigint);
$$;

-- Leave a group: true when the member was live (and the incarnation given, if not
-- NULL, is its); then NOTIFY pylease with the group's name. The row stays, gone,
-- until the group's next join. Without the WAL flush when this is the first write
-- of its transaction, as lease_release: a leave lost in a crash only keeps the
-- member until its expiry.
CREATE FUNCTION group_leave(grp text, member text, incarnation bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
DECLARE
    t_now   timestamptz;
    ignored text;
BEGIN
    IF group_leave.grp IS NULL OR group_leave.grp = '' OR length(group_leave.grp) > 190
       OR group_leave.member IS NULL OR group_leave.member = ''
       OR length(group_leave.member) > 200 OR pg_is_in_recovery()
    THEN
        PERFORM pylease_check_group(group_leave.grp);
        PERFORM pylease_check_key('member', group_leave.member);
        PERFORM pylease_refuse_standby('group_leave');
    END IF;
    ignored := CASE WHEN pg_current_xact_id_if_assigned() IS NULL
                    THEN set_config('synchronous_commit', 'off', true) END;

    t_now := clock_timestamp();
    UPDATE pylease_members AS m
       SET expires_at = t_now
     WHERE m.grp = group_leave.grp AND m.member = group_leave.member AND m.expires_at > t_now
       AND (group_leave.incarnation IS NULL OR m.incarnation = group_leave.incarnation);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    ignored := pg_notify('pylease', group_leave.grp);
    RETURN true;
END
$$;

-- Leave a group, whichever incarnation the member is.
CREATE FUNCTION group_leave(grp text, member text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT group_leave($1, $2, NULL::bigint);
$$;

-- The live members of a group, ordered by member (by their bytes, as SQLite orders).
CREATE FUNCTION group_members(grp text)
RETURNS TABLE(member text, incarnation bigint, joined_at timestamptz, renewed_at timestamptz,
              expires_at timestamptz, data jsonb)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_group($1);
    SELECT m.member, m.incarnation, m.joined_at, m.renewed_at, m.expires_at, m.data
      FROM pylease_members AS m
     WHERE m.grp = $1 AND m.expires_at > clock_timestamp()
     ORDER BY m.member COLLATE "C";
$$;

-- True iff the member is live with this incarnation. Locks its row FOR KEY SHARE:
-- a new join of the name changes the incarnation, a key column, so a write fenced by
-- membership in the caller's transaction and that join are serialized, while
-- renewals and leaves never wait for it.
CREATE FUNCTION member_holds(grp text, member text, incarnation bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
#variable_conflict use_column
BEGIN
    IF member_holds.grp IS NULL OR member_holds.grp = '' OR length(member_holds.grp) > 190
       OR member_holds.member IS NULL OR member_holds.member = ''
       OR length(member_holds.member) > 200 OR member_holds.incarnation IS NULL
    THEN
        PERFORM pylease_check_group(member_holds.grp);
        PERFORM pylease_check_key('member', member_holds.member);
        RAISE EXCEPTION 'pylease: incarnation must not be NULL'
            USING ERRCODE = '22023', COLUMN = 'incarnation';
    END IF;

    PERFORM FROM pylease_members AS m
      WHERE m.grp = member_holds.grp AND m.member = member_holds.member
        AND m.incarnation = member_holds.incarnation AND m.expires_at > clock_timestamp()
        FOR KEY SHARE;
    RETURN FOUND;
END
$$;

-- The assignment of partitions 0 .. partitions - 1 (1 to 1024) to members, a pure
-- function of the set of members: bounded-load rendezvous hashing. Every member gets
-- floor(partitions / n) or ceil(partitions / n) of the n members' partitions.
--   member_hash(m)  = FNV-1a, 32 bits, of m's UTF-8 bytes: h = 2166136261, then per
--                     byte h = ((h XOR byte) * 16777619) mod 2^32;
--   score(m, p)     = FNV-1a continued from member_hash(m) over the 4 bytes of p,
--                     big-endian, then mixed: h ^= h >> 16; h = h * 0x21f0aaad mod 2^32;
--                     h ^= h >> 15; h = h * 0x735a2d97 mod 2^32; h ^= h >> 15;
--   with q, r = partitions div n, partitions mod n, the pairs (m, p) are taken in the
--   order of score descending, then m's UTF-8 bytes, then p: p goes to m when p has
--   no member yet and m has fewer than q partitions, or q while fewer than r members
--   have q + 1.
-- Every product stays below 2^63, so SQLite's 64-bit integers compute the same.
CREATE FUNCTION pylease_assignment(members text[], partitions integer)
RETURNS TABLE(part integer, member text)
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
DECLARE
    sorted text[];
    hashes bigint[];
    owner  integer[];
    load   integer[];
    n      integer;
    q      integer;
    r      integer;
    extra  integer := 0;
    placed integer := 0;
    bytes  bytea;
    h      bigint;
    pair   record;
BEGIN
    SELECT array_agg(u.m ORDER BY convert_to(u.m, 'UTF8')) INTO sorted
      FROM (SELECT DISTINCT v FROM unnest(pylease_assignment.members) AS x(v) WHERE v IS NOT NULL)
           AS u(m);
    n := coalesce(cardinality(sorted), 0);
    IF n = 0 OR pylease_assignment.partitions IS NULL OR pylease_assignment.partitions < 1 THEN
        RETURN;
    END IF;
    hashes := array_fill(0::bigint, ARRAY[n]);
    FOR i IN 1 .. n LOOP
        bytes := convert_to(sorted[i], 'UTF8');
        h := 2166136261;
        FOR j IN 0 .. length(bytes) - 1 LOOP
            h := ((h # get_byte(bytes, j)) * 16777619) & 4294967295;
        END LOOP;
        hashes[i] := h;
    END LOOP;
    q := pylease_assignment.partitions / n;
    r := pylease_assignment.partitions % n;
    owner := array_fill(0, ARRAY[pylease_assignment.partitions]);
    load := array_fill(0, ARRAY[n]);

    -- OFFSET 0 keeps a step whose value is used twice from being copied into the
    -- next: planning the copies of copies took longer than the whole assignment.
    FOR pair IN
        SELECT s.p, s.i FROM (
            SELECT p.p, m.i::integer AS i, x5.h AS score
              FROM unnest(hashes) WITH ORDINALITY AS m(h, i)
             CROSS JOIN generate_series(0, pylease_assignment.partitions - 1) AS p(p)
             CROSS JOIN LATERAL (SELECT ((m.h # ((p.p >> 24) & 255)) * 16777619) & 4294967295 AS h) AS f1
             CROSS JOIN LATERAL (SELECT ((f1.h # ((p.p >> 16) & 255)) * 16777619) & 4294967295 AS h) AS f2
             CROSS JOIN LATERAL (SELECT ((f2.h # ((p.p >> 8) & 255)) * 16777619) & 4294967295 AS h) AS f3
             CROSS JOIN LATERAL (SELECT ((f3.h # (p.p & 255)) * 16777619) & 4294967295 AS h OFFSET 0) AS f4
             CROSS JOIN LATERAL (SELECT f4.h # (f4.h >> 16) AS h OFFSET 0) AS x1
             CROSS JOIN LATERAL (SELECT (x1.h * 569420461) & 4294967295 AS h) AS x2
             CROSS JOIN LATERAL (SELECT x2.h # (x2.h >> 15) AS h OFFSET 0) AS x3
             CROSS JOIN LATERAL (SELECT (x3.h * 1935289751) & 4294967295 AS h) AS x4
             CROSS JOIN LATERAL (SELECT x4.h # (x4.h >> 15) AS h) AS x5
        ) AS s
         ORDER BY s.score DESC, s.i, s.p
    LOOP
        IF owner[pair.p + 1] = 0
           AND load[pair.i] < q + (CASE WHEN extra < r THEN 1 ELSE 0 END)
        THEN
            IF load[pair.i] = q THEN
                extra := extra + 1;
            END IF;
            load[pair.i] := load[pair.i] + 1;
            owner[pair.p + 1] := pair.i;
            placed := placed + 1;
            EXIT WHEN placed = pylease_assignment.partitions;
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT (o.p - 1)::integer, sorted[o.i] FROM unnest(owner) WITH ORDINALITY AS o(i, p)
     ORDER BY o.p;
END
$$;

-- The assignment of partitions 0 .. partitions - 1 (1 to 1024) to the live members
-- (see pylease_assignment); no row when there is none.
CREATE FUNCTION group_assignment(grp text, partitions integer)
RETURNS TABLE(part integer, member text)
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pylease_check_group($1);
    SELECT pylease_check_count('partitions', $2, 1024, '1024');
    SELECT a.part, a.member
      FROM pylease_assignment(ARRAY(SELECT m.member FROM pylease_members AS m
                                     WHERE m.grp = $1 AND m.expires_at > clock_timestamp()),
                              $2) AS a;
$$;

COMMENT ON FUNCTION group_join(text, text, interval, jsonb) IS
    'pylease: join a group; the member''s incarnation, or NULL when that member name is live. NOTIFY pylease with the group.';
COMMENT ON FUNCTION group_renew(text, text, interval, bigint) IS
    'pylease: extend a live member (of this incarnation, unless NULL), never earlier; false once it is gone.';
COMMENT ON FUNCTION group_renew(text, text, interval) IS
    'pylease: extend a live member, never earlier; false once it is gone.';
COMMENT ON FUNCTION group_leave(text, text, bigint) IS
    'pylease: leave a group (this incarnation, unless NULL); true if the member was live. NOTIFY pylease with the group.';
COMMENT ON FUNCTION group_leave(text, text) IS
    'pylease: leave a group; true if the member was live. NOTIFY pylease with the group.';
COMMENT ON FUNCTION group_members(text) IS
    'pylease: the live members of a group, ordered by member.';
COMMENT ON FUNCTION member_holds(text, text, bigint) IS
    'pylease: true iff the member is live with this incarnation; locks it FOR KEY SHARE against a new join of the name.';
COMMENT ON FUNCTION group_assignment(text, integer) IS
    'pylease: the assignment of partitions 0 .. partitions - 1 to the live members (bounded-load rendezvous hashing).';
COMMENT ON FUNCTION pylease_assignment(text[], integer) IS
    'pylease (internal): the assignment of partitions to a set of members, as group_assignment gives it.';

-- Privileges ------------------------------------------------------------------

REVOKE ALL ON TABLE pylease_groups FROM PUBLIC;
REVOKE ALL ON TABLE pylease_members FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_group(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_check_data(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pylease_assignment(text[], integer) FROM PUBLIC;
