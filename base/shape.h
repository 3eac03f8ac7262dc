/* shape.h - dtypes and values, below every layer: element sizes and block
 * bytes (kvt_dtype_size, kvt_shape_block_bytes are public, in kvtier.h) and
 * the check that K/V hold no NaN or infinity. Pure functions, no state. */
#ifndef KVT_SHAPE_H
#define KVT_SHAPE_H

#include <stddef.h>
#include <stdint.h>

/* 0, or KVT_ENONFINITE when one of n_elems values of dtype (KVT_F32,
 * KVT_F16; anything else is read as KVT_BF16) is NaN or infinite. */
int kvt_finite_check(const void *data, size_t n_elems, uint32_t dtype);

#endif
