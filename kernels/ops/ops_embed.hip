/* ops_embed.hip: out[m] = table[ids[m]] as f32 and bf16 rows (family
 * ops_embed, see kernels/fam_ops_embed.c); zeros for an id outside [0, v).
 * Block: ROWS rows, THREADS threads striding a row. Shape: S_N. */

MT_KERNEL __launch_bounds__(THREADS) void ops_embed(const mt_bf16 *table, const int *ids,
                                                     float *xf, mt_bf16 *xb, int m, int v)
{
    for (int r = 0; r < ROWS; r++) {
        const int row = blockIdx.x * ROWS + r;
        if (row >= m)
            return;
        const int id = ids[row];
        const int ok = id >= 0 && id < v;
        for (int j = threadIdx.x; j < S_N; j += THREADS) {
            mt_bf16 b = ok ? table[(long)id * S_N + j] : (mt_bf16)0;
            xb[(long)row * S_N + j] = b;
            xf[(long)row * S_N + j] = mt_bf16_to_f32(b);
        }
    }
}
