/* weft/weft.h: the umbrella header; it only includes the others. */
#ifndef WEFT_WEFT_H
#define WEFT_WEFT_H

#include <weft/base.h>
#include <weft/core.h>
#include <weft/devices.h>
#include <weft/distribute.h>
#include <weft/grad.h>
#include <weft/memory.h>
#include <weft/nn.h>
#include <weft/ops.h>
#include <weft/placement.h>
#include <weft/runtime.h>
#include <weft/sched.h>
#include <weft/transport.h>

#endif /* WEFT_WEFT_H */
