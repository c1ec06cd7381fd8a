/* fuzz/fuzz_flight.c: libFuzzer target for weft-run's flight-record reader and merge
 * (tools/flight_verdict.c): the input is one rank's flight.rank<R>.jsonl as it may lie in
 * the job's directory (truncated by a death mid-write, or anything at all). A parse either
 * fails with a message or gives operations whose strings are NUL-terminated; the merge of
 * that record as ranks 0 and 1 of three (rank 2 without one) writes a NUL-terminated line
 * within its buffer. */
#include "flight_verdict.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fv_rank rs[3];
    char err[128];
    err[0] = 0;
    if (fv_parse((const char *)data, size, &rs[0], err, sizeof err) < 0) {
        if (!err[0] || rs[0].ops)
            abort();
        return 0;
    }
    for (size_t i = 0; i < rs[0].n_ops; i++) {
        const fv_op *o = &rs[0].ops[i];
        if (!memchr(o->op, 0, sizeof o->op) || !memchr(o->tag, 0, sizeof o->tag) ||
            !memchr(o->state, 0, sizeof o->state))
            abort();
    }
    rs[1] = rs[0];
    memset(&rs[2], 0, sizeof rs[2]);
    char line[256];
    size_t n = fv_verdict(rs, 3, line, sizeof line);
    if (n >= sizeof line || line[n] != 0 || strlen(line) != n)
        abort();
    fv_rank_free(&rs[0]);
    return 0;
}
