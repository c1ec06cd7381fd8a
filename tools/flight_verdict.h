/* tools/flight_verdict.h: merging the flight records of a job's ranks into one verdict line.
 * Owns: the reader of flight.rank<R>.jsonl files (written by wf_comm_flight_dump, format in
 * <weft/transport.h>), the merge, and weft-run's per-job flight directory.
 * Not here: writing the records (transport/flight.c), running the ranks (weft-run.c). */
#ifndef WF_TOOLS_FLIGHT_VERDICT_H
#define WF_TOOLS_FLIGHT_VERDICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define FV_MAX_RANKS 4096
#define FV_TAG       48

/* One operation of a record (only collectives take part in the merge). */
typedef struct fv_op {
    uint64_t seq, bytes, count, t0, t1;
    int peer;
    char op[16], dtype[8], state[8], tag[FV_TAG];
} fv_op;

/* One rank's record. */
typedef struct fv_rank {
    bool present; /* a header was read */
    int rank, size;
    char failed[24], reason[512];
    uint64_t now;
    fv_op *ops; /* collectives, oldest first (malloc) */
    size_t n_ops;
} fv_rank;

/* Parses one record ('len' bytes at 'p', not NUL-terminated) into 'out' (zeroed first).
 * Returns 0, or -1 with 'err' saying why (a header that is missing or malformed). Lines
 * after the header that are malformed or truncated are skipped: a rank may die mid-write.
 * Never reads past 'len'. Ownership: free 'out->ops' with fv_rank_free(). */
int fv_parse(const char *p, size_t len, fv_rank *out, char *err, size_t errlen);
void fv_rank_free(fv_rank *r);

/* Writes the verdict for the records of ranks 0 .. n-1 ('rs[r].present' false for a rank
 * without one) into 'out': "rank 1 never entered allreduce #4213 (bucket 3, step 17); ranks
 * 0,2 waited 10.0 s", or what can be said. Returns the length written. */
size_t fv_verdict(const fv_rank *rs, int n, char *out, size_t outlen);

/* weft-run's side: a job's flight directory. fv_job_begin() sets WEFT_FLIGHT_DIR for the
 * ranks (a new temporary directory, unless the caller set one: then that, kept);
 * fv_job_end() prints "weft-run: verdict: ..." to stderr when the job failed and removes
 * the directory it made. */
typedef struct fv_job {
    char dir[256];
    bool made; /* we made 'dir' (and remove it) */
} fv_job;

void fv_job_begin(fv_job *j);
/* Whether rank 'rank' has written its record in 'j' at or after 'since' (CLOCK_REALTIME):
 * weft-run waits for these before it ends the survivors of a failure. */
bool fv_job_has_record(const fv_job *j, int rank, const struct timespec *since);
void fv_job_end(fv_job *j, int n_ranks, bool failed);
/* Prints the verdict of the records in 'j' now (a start of the job failed) and removes them,
 * so the ranks of a restart write fresh ones. When the verdict blames ranks ("rank 1 never
 * entered allreduce #24 (step 5)", or "... left no flight record (stopped or killed?) and
 * never finished ..."), that clause goes to 'blame' (cap bytes), else "" does. */
void fv_job_report(fv_job *j, int n_ranks, char *blame, size_t cap);

#endif /* WF_TOOLS_FLIGHT_VERDICT_H */
