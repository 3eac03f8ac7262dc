/* remote_cli.c - the tools' side of the remote tier: opening an engine
 * with --remote URL, and the remote tier's counters in text and JSON.
 * The URL may hold a password: it is never printed. */
#include <stdio.h>
#include <time.h>

#include "util.h"

int cli_engine_open_remote(const char *dir, const kvt_options *opt, const char *url,
                           kvt_engine **out) {
  if (!url) return cli_engine_open(dir, opt, out);
  kvt_remote_options ro = {.size = sizeof ro, .url = url};
  return cli_engine_open_remote_info(dir, opt, &ro, out);
}

int cli_remote_get(kvt_engine *e, kvt_remote_stats *rs) {
  *rs = (kvt_remote_stats){.size = sizeof *rs};
  if (e && kvt_remote_stats_get(e, rs) == 0) return 1;
  rs->size = 0; /* none: the printers print nothing */
  return 0;
}

/* Writes to the cluster run in the background, and with a local cold tier
 * kvt_sync() does not wait for them: wait until `want` of them are settled
 * (stored, found there, dropped, cancelled or failed), at most ms, so a
 * command's report counts what it wrote. The same return as above. */
int cli_remote_get_settled(kvt_engine *e, kvt_remote_stats *rs, uint64_t want, unsigned ms) {
  for (unsigned waited = 0;; waited += 10) {
    if (!cli_remote_get(e, rs)) return 0;
    uint64_t settled = rs->writes + rs->write_exists + rs->write_dropped + rs->write_failures +
                       rs->write_cancelled;
    if (settled >= want || waited >= ms) return 1;
    nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
  }
}

void cli_remote_print(const kvt_remote_stats *r) {
  if (!r->size) return;
  kvt_remote_stats rs = *r;
  char in[32], out[32];
  printf("\nremote tier (this process): %llu hits, %llu misses, %llu timeouts, "
         "%llu checksum failures (%llu deleted)\n"
         "  bytes in %s, out %s; blocks written %llu, already there %llu, "
         "dropped %llu, cancelled %llu, failed %llu; copied to the local cold tier %llu\n"
         "  evictions noticed %llu (blocks seen in the cluster, then gone)\n",
         (unsigned long long)rs.hits, (unsigned long long)rs.misses,
         (unsigned long long)rs.timeouts, (unsigned long long)rs.checksum_failures,
         (unsigned long long)rs.deleted, fmt_bytes(in, sizeof in, rs.bytes_in),
         fmt_bytes(out, sizeof out, rs.bytes_out), (unsigned long long)rs.writes,
         (unsigned long long)rs.write_exists, (unsigned long long)rs.write_dropped,
         (unsigned long long)rs.write_cancelled, (unsigned long long)rs.write_failures,
         (unsigned long long)rs.local_copies, (unsigned long long)rs.evictions_noticed);
}

void cli_remote_json(json_w *j, const kvt_remote_stats *r) {
  if (!r->size) return;
  kvt_remote_stats rs = *r;
  json_obj(j, "remote");
  json_u64(j, "hits", rs.hits);
  json_u64(j, "misses", rs.misses);
  json_u64(j, "timeouts", rs.timeouts);
  json_u64(j, "checksum_failures", rs.checksum_failures);
  json_u64(j, "deleted", rs.deleted);
  json_u64(j, "bytes_in", rs.bytes_in);
  json_u64(j, "bytes_out", rs.bytes_out);
  json_u64(j, "writes", rs.writes);
  json_u64(j, "write_exists", rs.write_exists);
  json_u64(j, "write_dropped", rs.write_dropped);
  json_u64(j, "write_cancelled", rs.write_cancelled);
  json_u64(j, "write_failures", rs.write_failures);
  json_u64(j, "local_copies", rs.local_copies);
  json_u64(j, "evictions_noticed", rs.evictions_noticed);
  json_end(j);
}
