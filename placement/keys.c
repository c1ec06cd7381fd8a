/* placement/keys.c: the (step, micro-batch, edge) part of a graph transfer's key.
 * Owns: wf_xfer_key_pack() / wf_xfer_key_unpack() (weft/placement.h).
 * Why the micro-batch is in the key: in a pipeline a stage runs the micro-batches' forwards
 *   and backwards in its own order (1F1B's warm-up differs per stage), so the count of runs
 *   of two stages' sessions does not match; the micro-batch and the training step do.
 * Layout (below 2^39, the transport keeps bit 39 for graph keys and bit 0 for the part):
 *   step mod 2^15 << 24 | micro-batch (8 bits) << 16 | edge (15 bits) << 1.
 * Not here: source, destination and incarnation (the transport puts them in each message). */
#include "internal.h"

#define STEP_BITS 15
#define MB_BITS   8
#define EDGE_BITS 15

int wf_xfer_key_pack(const wf_xfer_key *k, uint64_t *out)
{
    if (!k || !out)
        return wf__err(WF_EINVAL, "wf_xfer_key_pack: NULL argument");
    if (k->micro_batch >= 1u << MB_BITS)
        return wf__err(WF_EINVAL, "transfer key: micro-batch %u is not below %u", k->micro_batch,
                       1u << MB_BITS);
    if (k->edge >= 1u << EDGE_BITS)
        return wf__err(WF_EINVAL, "transfer key: edge %u is not below %u", k->edge,
                       1u << EDGE_BITS);
    uint64_t step = k->step & ((1u << STEP_BITS) - 1);
    *out = step << (1 + EDGE_BITS + MB_BITS) | (uint64_t)k->micro_batch << (1 + EDGE_BITS) |
           (uint64_t)k->edge << 1;
    return 0;
}

wf_xfer_key wf_xfer_key_unpack(uint64_t key)
{
    wf_xfer_key k;
    k.edge = (uint32_t)(key >> 1) & ((1u << EDGE_BITS) - 1);
    k.micro_batch = (uint32_t)(key >> (1 + EDGE_BITS)) & ((1u << MB_BITS) - 1);
    k.step = (uint32_t)(key >> (1 + EDGE_BITS + MB_BITS)) & ((1u << STEP_BITS) - 1);
    return k;
}
