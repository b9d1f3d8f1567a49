// A Node.js client of pylease's SQL API, as any application would write one:
// every decision is one call of a lease_* function; bigint fences stay strings.
//
//   node lease.js DSN claim   NAME TTL HOLDER        -> {"fence": "3"} or {"fence": null}
//   node lease.js DSN renew   NAME HOLDER            -> {"renewed": true}
//   node lease.js DSN release NAME HOLDER            -> {"released": true}
//   node lease.js DSN holds   NAME HOLDER FENCE      -> {"holds": true}
//   node lease.js DSN write   NAME HOLDER FENCE      -> {"written": true}  (fenced write)
//   node lease.js DSN status  NAME                   -> {"holder": ..., "fence": ..., "held": ...}
//   node lease.js DSN hold    NAME TTL HOLDER SECS   -> claims, renews every ttl/3, releases
//                                                       after SECS; one JSON line per event
'use strict';

const { Client } = require('pg');

async function one(client, sql, params) {
  const result = await client.query(sql, params);
  return result.rows[0];
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const [dsn, command, ...args] = process.argv.slice(2);
  const client = new Client({ connectionString: dsn, application_name: 'pylease-node' });
  await client.connect();
  const say = (event) => process.stdout.write(JSON.stringify(event) + '\n');
  try {
    switch (command) {
      case 'claim': {
        const [name, ttl, holder] = args;
        const row = await one(client, 'SELECT lease_claim($1, $2::interval, $3) AS fence', [name, ttl, holder]);
        say({ fence: row.fence });
        break;
      }
      case 'renew': {
        const [name, holder] = args;
        say({ renewed: (await one(client, 'SELECT lease_renew($1, $2) AS ok', [name, holder])).ok });
        break;
      }
      case 'release': {
        const [name, holder] = args;
        say({ released: (await one(client, 'SELECT lease_release($1, $2) AS ok', [name, holder])).ok });
        break;
      }
      case 'holds': {
        const [name, holder, fence] = args;
        say({ holds: (await one(client, 'SELECT lease_holds($1, $2, $3) AS ok', [name, holder, fence])).ok });
        break;
      }
      case 'write': {
        // The write and the check in one statement: a stale holder's write cannot land.
        const [name, holder, fence] = args;
        const result = await client.query(
          'INSERT INTO writes (holder, fence, client) SELECT $2, $3, \'node\' WHERE lease_holds($1, $2, $3)',
          [name, holder, fence]);
        say({ written: result.rowCount === 1 });
        break;
      }
      case 'status': {
        const [name] = args;
        const row = await one(client, 'SELECT holder, fence, held FROM lease_status($1)', [name]);
        say(row || {});
        break;
      }
      case 'hold': {
        const [name, ttl, holder, secs] = args;
        const ttlSeconds = Number(ttl);
        const row = await one(client, 'SELECT lease_claim($1, make_interval(secs => $2), $3) AS fence',
          [name, ttlSeconds, holder]);
        if (row.fence === null) {
          say({ event: 'busy' });
          break;
        }
        say({ event: 'held', fence: row.fence });
        const until = Date.now() + Number(secs) * 1000;
        while (Date.now() < until) {
          await sleep(Math.min((ttlSeconds * 1000) / 3, Math.max(until - Date.now(), 0)));
          const renewed = (await one(client, 'SELECT lease_renew($1, $2) AS ok', [name, holder])).ok;
          say({ event: 'renewed', ok: renewed });
          if (!renewed) break;
        }
        const released = (await one(client, 'SELECT lease_release($1, $2) AS ok', [name, holder])).ok;
        say({ event: 'released', ok: released });
        break;
      }
      default:
        throw new Error(`unknown command ${command}`);
    }
  } finally {
    await client.end();
  }
}

main().catch((error) => {
  process.stderr.write(`lease.js: ${error.code || ''} ${error.message}\n`);
  process.exit(error.code === '22023' ? 2 : 3);
});
