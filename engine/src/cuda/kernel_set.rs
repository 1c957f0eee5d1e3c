//! Kernel families switched per model (A/B and fallbacks; `LAGUNA_KERNELS`).
/// Kernel families. The weight-streaming regime (passes below `gemm_min_rows`: decode steps,
/// DFlash propose/verify): each family computes a row with arithmetic that does not depend on
/// the pass size, so decode and verify stay bit-identical whichever set is chosen; `laguna bench`
/// compares each family against the original f32 kernels (`KernelSet::original`) at the real
/// shapes. The long-pass (prefill) regime: `cublas` .. `cublas_router` below (A/B switches; all
/// but the BF16-only ones keep the hi + lo precision). `laguna device-test` compares the default
/// set against the CPU on every fixture. Environment: LAGUNA_KERNELS=original, or a comma list of
/// families to turn on or off (e.g. `-tc_gemv,-attn_gqa`, `+bf16_attn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSet {
    /// BF16 Linears as tensor-core GEMV (`linear_tc_bf16`) instead of f32 SIMT.
    pub tc_gemv: bool,
    /// Multi-row SIMT GEMV with 2 weight rows per warp (`linear_*_m8/_m16`) instead of 8-row `linear_*`.
    pub small_m: bool,
    /// Persistent grouped MoE (`moe_*_s`) instead of one block row per group (`moe_*`, `moe_*_1`).
    pub moe_s: bool,
    /// GQA-packed decode attention (`attention_gqa`) instead of one block per query head.
    pub attn_gqa: bool,
    /// Long passes (prefill): dense BF16 Linears through cuBLAS (hi and lo halves of the
    /// activations as two accumulating GEMMs) when libcublas loads, instead of `gemm_bf16`.
    pub cublas: bool,
    /// Long passes: activations rounded to BF16 alone (vLLM's numerics, one mma per fragment
    /// instead of hi + lo) for the dense Linears (`bf16_dense`), the expert GEMMs (`bf16_moe`) and
    /// Q and P in the prefill attention (`bf16_attn`).
    pub bf16_dense: bool,
    pub bf16_moe: bool,
    pub bf16_attn: bool,
    /// Long passes: the NVFP4 expert down GEMM with 128-output tiles (`moe_gemm_down_fp4_w`: the
    /// same arithmetic per element as the 64-wide tiles; faster for down, K = 512, and slower
    /// for gate/up, K = 2048, which keeps 64: run 63).
    pub moe_wide: bool,
    /// Long passes: in the NVFP4 expert GEMMs a warp whose tile rows are all padding skips its
    /// mma (`moe_gemm_*_k`; the other rows' arithmetic is unchanged; run 65: 107.7 -> 105.1 ms).
    pub moe_skip: bool,
    /// With `moe_skip`: also the second 16-row block of a warp's 32 rows when it is all padding
    /// (`moe_gemm_gate_up_fp4_ks16`, `moe_gemm_down_fp4_wk16`; same arithmetic for real rows).
    pub moe_skip16: bool,
    /// Long passes: `attention_prefill` with base-2 exponentials (`attention_prefill_x`,
    /// `_fp8_x`: log2(e) folded into the score scale, ex2.approx per score, as FlashAttention and
    /// vLLM compute it) instead of expf of natural-unit scores. On (run 80): 21.6 -> 20.5 ms a 2K
    /// prefill; device-test errors against the CPU stay at their level (e.g. nvfp4-experts [gemm]
    /// 2.796e-3 -> 2.783e-3); the largest move is a near-tied pick in perelement-softcap-dense1
    /// [fp8] decode (5.3e-6 -> 1.7e-3, limit 2e-2; greedy still 36/36).
    pub attn_ex2: bool,
    /// With attn_ex2: Q fragments in shared memory, 3 blocks / SM without spills
    /// (`attention_prefill_q`, `_fp8_q`: 157 registers, 35 KB static + 34 KB dynamic shared
    /// memory; the same values in the same mma order as `_x`: device-test table identical). On
    /// where an SM holds 3 such blocks (`fit`; H200 yes, GB10 no): 20.5 -> 18.5 ms (run 81).
    pub attn_q: bool,
    /// NVFP4 expert GEMVs (weight-streaming regime) with all of a warp's weight loads in flight
    /// at once and one item per warp (`moe_gate_up_fp4_sp`, `moe_down_fp4_sp`; the per-slot
    /// arithmetic of `moe_*_s`, so the same bits: kbench and device-test, run 78). On: decode
    /// 263 -> 270 tok/s (run 78; kbench: gate_up 11.6 -> 9.9 us, down 7.1 -> 6.0 us a layer).
    pub moe_sp: bool,
    /// Long passes: SiLU(gate) * up in the NVFP4 gate/up GEMM's epilogue (`moe_gemm_gate_up_fp4_ks`,
    /// interleaved gate / up columns; no f32 gate | up round trip, no `silu_mul_split`).
    pub moe_silu: bool,
    /// Long passes: the MoE combine and the next layer's input RMSNorm + split in one launch
    /// (`moe_combine_norm` with xs; the same arithmetic as `moe_combine` then `rmsnorm_split`).
    pub comb_norm: bool,
    /// Long passes: the router GEMM on cuBLAS too (hi and lo, like the dense Linears).
    pub cublas_router: bool,
    /// One-row passes (decode): a MoE layer's post-attention norm, router, top-k, expert GEMVs
    /// and combine as one persistent launch with grid-wide barriers (`moe_block_1`) instead of
    /// six; the same arithmetic in the same order as those kernels (same bits, checked by
    /// `laguna kbench` and the bench's greedy fingerprint on the H200: 292 vs 268 tok/s).
    pub moe_mk: bool,
    /// Decode attention with each thread's q and key-tile loads issued together
    /// (`attention_gqa_l`: page-table entries, then K/V rows, three items at a time) instead of one
    /// round trip per loop iteration; the same bits (greedy fingerprint and device-test on the
    /// H200; 303.5 vs 302.3 tok/s alone, 309.1 with `qk_ld`).
    pub gqa_ld: bool,
    /// Decode q/k norm + RoPE + K/V write with its independent loads issued first
    /// (`qk_norm_rope_kv_l`); the same bits (H200: 307.9 vs 302.3 tok/s, 0.24 vs 0.31 ms a
    /// step eager).
    pub qk_ld: bool,
    /// Decode steps (every row alone in its sequence): q/k norm + RoPE + K/V write inside the
    /// split-KV decode attention (`attention_gqa_qk`: each block norms its query heads, the block
    /// holding the row's own key writes it), one launch fewer a layer; the same bits as
    /// `qk_norm_rope_kv_l` + `attention_gqa_l` (kernels/emu; kbench on the H200) and the same
    /// greedy fingerprint: 315.8 / 314.9 vs 307.7 / 308.3 tok/s.
    pub attn_qk: bool,
    /// Sliding-window layers: split-KV grids of min(nsplit, ceil(window / 32)) splits instead of
    /// nsplit (a row of such a layer never has more; the same splits, so the same bits, without
    /// the blocks that return at once): 316.7 / 317.3 vs 313.4 / 313.3 tok/s on the H200.
    pub swa_ns: bool,
    /// `attn_qk` on full-attention layers too (else only on sliding-window ones). Off: there the
    /// fused kernel's 9 warps at 72 registers fit 3 blocks an SM against `attention_gqa_l`'s 4
    /// (H200: 131K-context decode 8.65 ms a step with it, 8.23 without; 2K 319.0 vs 317.5 tok/s).
    pub qk_full: bool,
    /// `attention_merge_16`: a thread's split values loaded sixteen at a time instead of eight
    /// (a sliding layer's 16 splits in one L2 round trip); the same arithmetic, so the same bits.
    pub merge16: bool,
    /// Greedy argmax of the logits rows by `argmax_rows_p` (up to 64 blocks a row, folded by a
    /// 64-bit atomicMax) instead of one block a row (`argmax_rows`); the same index.
    pub argmax_p: bool,
    /// With `argmax_p`: a `decode_step` (serving) whose rows are all greedy takes its tokens from
    /// `argmax_rows_p` instead of `sample_rows` (the same index). On (run 115): greedy
    /// `decode_step` 331.2 / 328.4 -> 335.4 / 333.9 tok/s with `merge64`; the serving checks
    /// (DFlash CLI + server, sampled serve = generate) pass with it.
    pub serve_argmax: bool,
    /// With `merge16`: merges of more than 16 splits (full-attention layers) by
    /// `attention_merge_64`, 64 split values a thread loaded at once (one L2 round trip for a
    /// 2K-token row's 64 splits instead of four); the same arithmetic, so the same bits (kbench,
    /// kernels/emu, greedy fingerprint). Run 115: 8.21 -> 8.00 us a full layer's merge alone.
    pub merge64: bool,
    /// With `tc_gemv`: BF16 GEMVs read a tile-interleaved copy of their weights
    /// (`linear_tc_bf16_tl`; each warp load 512 contiguous bytes instead of 64 bytes of 8 rows),
    /// made at load by `tile_bf16` next to the row-major matrix the prefill GEMMs read (the
    /// BF16 projections and lm_head twice in memory: +3.4 GB for XS-2.1, +0.9 GB for its draft, counted by
    /// `laguna plan`); the same bits. Run 124: decode 335.0 / 336.1 -> 342.2 / 344.7 tok/s.
    pub tc_tl: bool,
    /// The split-KV decode attention of full-attention layers on tensor cores (`attention_tc`,
    /// `_fp8`: a block of 4 warps per (row, KV head, split), a row's splits from `tc_splits` (at
    /// least 64 keys each, 16 for a 2K row, one per 512 keys past 8K), Q . K^T and P . V by mma
    /// with Q and P as BF16 hi + lo, merged by
    /// `attention_merge_tc` / `_tc64`) after `qk_norm_rope_kv*`, instead of `attention_gqa*` and
    /// its 32-key splits. Other bits than `attention_gqa` (float64 agreement ~3e-6 in
    /// kernels/emu); decode and verify rows take the same kernel, so they stay bit-identical.
    /// On (session 17): a full layer's attention chain 22.4 -> 14.7 us (kbench), decode 346-349
    /// -> 355 tok/s at 2K, 7.50 -> 4.88 ms a step at 131K (PERF.md runs 142-143).
    /// With `attn_qk`, passes whose rows are each alone in their sequence take
    /// `attention_tc_qk`, the q/k norm + RoPE + K/V write inside the launch (the same bits).
    pub attn_tc: bool,
    /// `attn_tc` on sliding-window layers too (`attention_tc_qk` / `attention_tc` instead of
    /// `attention_gqa_qk` / `attention_gqa_l`). Off: slower in the step (PERF.md runs 142-144).
    pub attn_tc_swa: bool,
    /// With `moe_mk`: each block of `moe_block_1` computes the down items of its own output rows
    /// (every slot's) and combines them into the residual after a block barrier, instead of down
    /// items over the whole grid, a grid barrier, then the combine (`moe_block_1g`); one grid
    /// barrier and one L2 round trip fewer a layer, the same arithmetic (kernels/emu: the same
    /// bits as the seven launches either way).
    pub moe_dl: bool,
    /// With `moe_dl`: the blocks of `moe_block_1` that hold none of the next input norm's
    /// elements arrive at its last grid barrier and exit instead of waiting (`moe_block_1w`
    /// waits), so the next q|k|v|g GEMV's blocks take their SMs and start their weight loads
    /// while the norm runs. Same values.
    pub moe_x: bool,
    /// The device sampler (`decode_step` rows with temperature > 0) over many blocks a row
    /// (`sample_rows_g`: each block a chunk of the row, per-row barriers, histograms summed by
    /// integer atomics, so the same choice as the one-block `sample_rows`).
    pub samp_g: bool,
    /// The embedding gather and the first layer's input RMSNorm as one launch (`embed_norm`:
    /// each thread norms the residual elements it wrote, with rmsnorm's code, so the same bits).
    pub embed_norm: bool,
    /// One-row passes: the last layer's `moe_block_1` ends with the final RMSNorm of the row (its
    /// next-input-norm phase with the final norm's weight, into the lm_head's input) instead of a
    /// separate `rmsnorm` launch before the lm_head. Same arithmetic.
    pub mk_final: bool,
    /// With `tc_tl`: the BF16 GEMV's weight loads do not allocate in L1 (`linear_tc_bf16_tln`,
    /// `ld.global.nc.L1::no_allocate`; the same bits): the streamed weights, read once, leave
    /// the L1 to the activations the blocks of an SM share. With `moe_na`: 2.656 -> 2.472 ms a
    /// step on the H200 (PERF.md runs 181-182).
    pub tc_na: bool,
    /// With `moe_mk`, `moe_dl` and `moe_x`: `moe_block_1`'s expert weight and scale loads do
    /// not allocate in L1 (`moe_block_1n`; the same bits). Alone 2.656 -> 2.634 ms a step, with
    /// `tc_na` 2.472 (PERF.md run 182).
    pub moe_na: bool,
    /// With `moe_sp`: the multi-row expert GEMVs (DFlash verify, several decode sequences) load
    /// their weights and scales without allocating in L1 (`moe_gate_up_fp4_spn`,
    /// `moe_down_fp4_spn`; the same bits), as `moe_na` does for one row. DFlash k=6 verify
    /// 6.470 -> 6.320 ms on the H200 (PERF.md run 185).
    pub sp_na: bool,
    /// With `moe_mk`, `moe_dl`, `moe_x` and `moe_na`: no grid barrier between `moe_block_1`'s
    /// router GEMV and its top-k; every block reads the logits until none is unset
    /// (`moe_block_1np`; the same bits): 2.419-2.423 -> 2.391 ms a step on the H200 (PERF.md
    /// run 189).
    pub moe_poll: bool,
    /// The split-KV merges (`merge16` / `merge64` forms, the sliding layers' and `attn_tc`'s) in
    /// one memory round trip after their PDL wait instead of three (`attention_merge_16r`,
    /// `_64r`, `_tcr`, `_tc64r`: position, split count and sink read before the wait, then a
    /// thread's split values and gate asked for with the block's split maxima and sums; the same
    /// arithmetic in the same order, so the same bits), launched with PDL. On since session 27:
    /// 2.402 / 2.404 -> 2.389 / 2.389 ms a step on the H200, 2.379 / 2.378 with `moe_rp` (PERF.md
    /// run 191).
    pub merge_r: bool,
    /// With `moe_poll`: `moe_block_1npr`, whose router warps load their two rows into registers
    /// before the PDL wait instead of asking them into L2, so phase 1 holds one L2 round trip
    /// fewer (the same products and sums in the same order: the same bits). On since session 27
    /// (with `merge_r`; PERF.md run 191).
    pub moe_rp: bool,
    /// NVFP4 experts at H 2048 and I 512 (Laguna-XS 2.1), with `moe_mk`, `moe_dl`, `moe_x`,
    /// `moe_na`, `moe_poll` and `moe_sp`: the expert items take their dot products on tensor
    /// cores (mma.sync f16: every code times its block scale, exact in f16; the activations as
    /// f16 hi + lo of x * 2^-4, ~22 bits; f32 accumulation) instead of f32 FMAs on decoded
    /// codes, about half the instructions an item: one-row passes in `moe_block_1nprt` /
    /// `_1npt`, multi-row passes (DFlash verify, several sequences) in `tc_bfrag_rows` +
    /// `moe_gate_up_fp4_tc` + `moe_down_fp4_tc` with the same per-row arithmetic, so a verified
    /// row keeps its decoded bits (`laguna kbench`; `laguna device-test --dflash-pair` on the
    /// synthetic XS-2.1 pair). Other bits than the f32 items: 1.8e-6 of the layer update
    /// (kbench), 5.7e-7 of it against float64 (kernels/emu). On since session 30: 2.232 ->
    /// 2.185 ms a decode step on the H200, DFlash k=6 step 6.62 -> 6.21 ms (PERF.md runs
    /// 205-206).
    pub moe_tc: bool,
    /// With `attn_tc` and `attn_qk`: a BF16 cache's `attention_tc_qk` grids of at most one block
    /// an SM (the decode step's full layers) take `attention_tc_qk3`, three 16-key K/V steps a
    /// warp asked for before the PDL wait instead of two: a 2K row's 129-132-key split is nine
    /// steps, and warp 0's third was a DRAM round trip after its first step. The same
    /// arithmetic, the same bits (kernels/emu); 115 KB of shared memory, so off where an SM
    /// holds less (`fit`). On since session 31: 2.194-2.199 -> 2.186-2.193 ms a decode step on
    /// the H200 (PERF.md runs 211-212).
    pub tc_nst3: bool,
    /// The BF16 tensor-core GEMV at 5 warps a block instead of 4 where N > 4096 and its 16-row
    /// groups number at most 4 an SM (XS-2.1's 48-head layers' q|k|v|g: 515 blocks): at 4
    /// warps (82 registers) an SM holds 5 of its blocks and the blocks filled ~110 SMs; at 5 it
    /// holds 4, so all 129 stream (11.0-11.3 -> 9.7-10.8 us a launch). Other bits for those
    /// GEMVs (the K split), still fixed per (N, K) on a device, never by the pass's rows. On
    /// since session 31: 2.189 -> 2.185-2.186 ms a decode step on the H200 (PERF.md run 213).
    pub tc_s5: bool,
    /// With `tc_na`: the BF16 GEMV with no branch inside a round (`linear_tc_bf16_tlnb`): a
    /// round's activation loads all issued with its weight loads, before its first mma (the
    /// compiler had put three of the four slots' after the first slot's mma, which waits on
    /// DRAM: a DRAM and then an L2 round trip a round). The same bits. On since session 32:
    /// 2.182-2.183 -> 2.126-2.128 ms a decode step on the H200 (PERF.md run 217).
    pub tc_bf: bool,
    /// With `moe_tc` and `moe_rp`: `moe_block_1nprtd`, whose gate/up items make their first mma
    /// depend on all ten of their loads (an XOR with (E >> 16) & the other words, a zero the
    /// compilers cannot see since E <= 256), so that ptxas
    /// issues them all before it: the SASS of `moe_block_1nprt` has four code loads after the
    /// first mma, a second DRAM round trip an item. The same bits (kernels/emu). Off: not yet
    /// measured on a GPU (session 32 had no device time left).
    pub moe_dep: bool,
    /// With `moe_tc` and `moe_rp`: `moe_block_1nprtg` (`_1nprtdg` with `moe_dep`), which reads
    /// the experts' gate and up global inverse scales into shared memory before its PDL wait:
    /// the SASS of `moe_block_1nprt` loads `ginv[e]` / `uinv[e]` after a gate/up item's mma
    /// chain, where they are used, so every item ends with one more memory round trip before
    /// its output store, which the next grid barrier waits for. The same bits (kernels/emu).
    /// Off: within the noise (PERF.md run 219).
    pub moe_gi: bool,
    /// With `tc_nst3`: `attention_tc_qk3p`, whose chain before the PDL wait is two dependent
    /// round trips instead of five (the sequence row loaded with the position, every stage's
    /// page entry before the first stage's copies) and which also reads the q/k norm weights,
    /// the rotary frequencies and the new key's page entry before that wait (attention_gqa_qk
    /// does; `attention_tc_qk3` reads them after it, beside q: DRAM round trips, the step's
    /// weight stream evicts them from L2, where q is an L2 one). The same bits (kernels/emu).
    /// Off: within the noise (PERF.md run 219).
    pub tc_pre: bool,
    /// `attention_gqa_qkp` for the sliding layers' decode attention: its sequence row loaded
    /// with its position instead of after the exit test that needs the position (one dependent
    /// round trip fewer before its page entries, K/V rows and PDL wait). The same bits
    /// (kernels/emu). Off: within the noise (PERF.md run 219).
    pub gqa_pre: bool,
    /// With `tc_bf`: `linear_tc_bf16_tlnd` for one-row GEMVs at 16 warps a block (N <= 2048:
    /// o_proj and the dense MLP's down projection, one block an SM, K <= 8192): two rounds of
    /// weight loads in flight a warp instead of one (round r + 2's loads right after round r's
    /// mma, up to 128 registers, which one block an SM leaves free), the activation row staged
    /// in shared memory once. The same tiles in the same order: the same bits (kernels/emu).
    /// On since session 34 (PERF.md run 221: 2.138 -> 2.126 ms a step).
    pub tc_db: bool,
    /// With `tc_bf`: `linear_tc_bf16_tlndq` for the one-row GEMVs of 4 or 5 warps a block with
    /// 4096 < N <= 16384 and K <= 2048 (the q|k|v|g, the dense MLP's gate and up): `tc_db`'s two
    /// rounds in flight a warp at 96 registers, so an SM still holds 20 warps. The same bits
    /// (kernels/emu). Off: its first form (18 KB of shared memory a block) was faster alone but
    /// slower in the graph (PERF.md run 222); the 10.5 KB form no faster (run 223, H100: its
    /// launches 4.9 us faster, the MoE launch before them and their own gaps longer).
    pub tc_dbq: bool,
    /// With `tc_db`: a dense MLP's one-row down projection is `linear_tc_bf16_tlnds`, which
    /// stages silu_mul's SiLU(gate) * up from the gate | up row itself, so no `silu_mul` launch
    /// precedes it (XS-2.1's layer 0). The same bits (kernels/emu; on the H100 of PERF.md run
    /// 223 the XS-2.1 DFlash pair bit for bit, the same fingerprint). On since session 36: a
    /// launch fewer, 1-3 us a step in every A/B of runs 223 and 225 (within their spread).
    pub silu_fold: bool,
    /// With `attn_qk`: `attention_gqa_qkc` for the sliding layers' decode attention (BF16 cache,
    /// 2-16 splits): a KV head's split blocks launched as one thread block cluster merge their
    /// splits through distributed shared memory, so no `attention_merge_16r` launch follows
    /// (30 launches and their gaps a step fewer). The merge's arithmetic in the same order on
    /// the same values: the same bits (kernels/emu). Used only where the driver says every
    /// cluster is resident at once (`Dev::cluster_fit`). Off: slower (PERF.md run 222 padded on
    /// an H200, run 223 unpadded on an H100).
    pub gqa_cl: bool,
    /// With `tc_db` and `merge_r`: a one-row pass's split merge (`attention_merge_16r` /
    /// `_tcr`) and its o_proj GEMV (`linear_tc_bf16_tlnd`) in one launch,
    /// `linear_tc_bf16_tlndm`: the first nh blocks merge a head each, a grid barrier, then the
    /// GEMV on the merged row; its blocks stream the o_proj's weights from the moment the
    /// attention's blocks leave instead of after the merge launch's. The same bits (kernels/emu).
    /// Used where the GEMV's blocks all fit at once (one an SM). Off: the same bits on an H100
    /// (PERF.md run 225: device-test, the XS-2.1 DFlash pair, the fingerprint) but 6-8 us a step
    /// slower.
    pub merge_o: bool,
    /// With `argmax_p` and `tc_bf`: a greedy pass's lm_head GEMV is `linear_tc_bf16_tlnba`,
    /// which also folds each block's logits into the rows' argmax slots (one 64-bit atomicMax a
    /// row a block, nothing waits for it), and `argmax_fin` reads the tokens from the slots:
    /// no `argmax_rows_p` launch and no second read of the logits. The same logits and the same
    /// tokens (kernels/emu, ties, NaN and zero rows included; on the device the same
    /// fingerprint, device-test rows and DFlash pair). On since session 37: 2.439 -> 2.435 ms a
    /// step in both rounds of PERF.md run 228 (H100).
    pub lm_argmax: bool,
    /// With `attn_qk`: the sliding layers' decode attention (BF16 cache, 2-16 splits) is
    /// `attention_gqa_qkl`, whose split blocks take a ticket on their (row, KV head) counter
    /// after writing their partials; the last of a row's splits merges the group's heads with
    /// `attention_merge_16r`'s arithmetic, so no merge launch follows (30 launches and their
    /// gaps a step fewer) and no block waits on another (no cluster, no grid barrier: what made
    /// `gqa_cl` and session 16's grid-barrier merge slower). The same bits (kernels/emu; on the
    /// device, PERF.md run 228). Off: 33 us a step slower there (H100), ~1.1 us a sliding layer.
    pub gqa_lm: bool,
    /// With `tc_nst3`: the full layers' decode attention of a 16-split grid is
    /// `attention_tc_qk3l`, `gqa_lm`'s ticket for `attention_tc_qk3`: the last split block of a
    /// (row, KV head) copies the group's partials into its shared memory in one round trip and
    /// merges them with `attention_merge_tcr`'s arithmetic, so no merge launch follows (10 a
    /// step). The same bits (kernels/emu; on the device, PERF.md run 228). Off: 65 us a step
    /// slower there (H100), ~6.5 us a full layer.
    pub tc_lm: bool,
    /// With `tc_gemv`: a GEMV pass (fewer rows than `gemm_min_rows`) runs a dense MLP's gate
    /// and up projections as one launch over their stacked matrix (MlpW::Dense's `gu`: XS-2.1's
    /// layer 0, every DFlash draft layer) with the gate launch's kernel and warps a block, so
    /// each output is computed as its half's launch computes it: the same bits (kernels/emu
    /// invariance; on an H100, PERF.md runs 230-232: device-test 42 rows, the XS-2.1 DFlash
    /// pair bit for bit, the same fingerprint), a launch and its boundary fewer. On since
    /// session 38: graph 2.441 -> 2.439-2.440 ms a step, the draft's propose 0.647-0.649 ->
    /// 0.634-0.636 ms.
    pub gu_fuse: bool,
    /// With `tc_bf`: a one-row pass's RMSNorm of the residual whose only reader is a GEMV that
    /// `linear` would launch as `linear_tc_bf16_tlnb` with K = the hidden size <= 2048 (XS-2.1's
    /// layer 0 post-attention norm before the fused gate | up, layer 1's input norm before its
    /// q|k|v|g: the two norms no moe_block_1 or embed_norm launch already does) runs in that
    /// GEMV's prologue, `linear_tc_bf16_tlnbr`: every block norms the row itself with rmsnorm's
    /// reduction order (rms_inv_nb), so no rmsnorm launch precedes it. The same bits
    /// (kernels/emu invariance; on an H100, PERF.md run 235: device-test, the XS-2.1 DFlash pair
    /// bit for bit, the same fingerprint). Off: no gain there (graph 2.439 / 2.440 ms a step
    /// with and without it).
    pub norm_fold: bool,
    /// With `moe_tc` and `moe_rp`: `moe_block_1nprtx`, whose prologue loads its small weights
    /// (post-attention norm, router bias, next input norm) together into registers and keeps them
    /// across the PDL wait, where `moe_block_1nprt` loads and stores them to shared memory one
    /// after another (up to six dependent round trips before the wait, which a block that only
    /// becomes resident as the o_proj GEMV's last blocks leave runs after that GEMV has ended).
    /// The same bits (kernels/emu, the XS-2.1 DFlash pair). On since session 40: 2.406 -> 2.375
    /// ms a decode step on an H100 (PERF.md runs 238-239).
    pub moe_pwr: bool,
    /// With `moe_pwr`: `moe_block_1nprtxs`, whose blocks ask L2 for the folded shared expert's
    /// weights (gate / up / down codes and scale bytes: the one expert that does not depend on
    /// the routing) right after the PDL wait, one 128-byte line a thread, so that its items read
    /// L2 and the DRAM delivers eight slots instead of nine in the gate/up and down phases, where
    /// it is the bound. Timing only: the same bits (device-test, the XS-2.1 DFlash pair, the
    /// fingerprint). On since session 41: 2.405-2.409 -> 2.387 ms a decode step on an H100
    /// (PERF.md run 245).
    pub moe_shpf: bool,
}

impl KernelSet {
    pub fn original() -> KernelSet {
        KernelSet {
            tc_gemv: false,
            small_m: false,
            moe_s: false,
            attn_gqa: false,
            cublas: false,
            bf16_dense: false,
            bf16_moe: false,
            bf16_attn: false,
            moe_wide: false,
            moe_skip: false,
            moe_skip16: false,
            attn_ex2: false,
            attn_q: false,
            moe_sp: false,
            comb_norm: false,
            moe_silu: false,
            cublas_router: false,
            moe_mk: false,
            gqa_ld: false,
            qk_ld: false,
            attn_qk: false,
            swa_ns: false,
            qk_full: false,
            merge16: false,
            argmax_p: false,
            serve_argmax: false,
            merge64: false,
            tc_tl: false,
            attn_tc: false,
            attn_tc_swa: false,
            moe_dl: false,
            moe_x: false,
            samp_g: false,
            embed_norm: false,
            mk_final: false,
            tc_na: false,
            moe_na: false,
            sp_na: false,
            moe_poll: false,
            merge_r: false,
            moe_rp: false,
            moe_tc: false,
            tc_nst3: false,
            tc_s5: false,
            tc_bf: false,
            moe_dep: false,
            moe_gi: false,
            tc_pre: false,
            gqa_pre: false,
            tc_db: false,
            tc_dbq: false,
            silu_fold: false,
            gqa_cl: false,
            merge_o: false,
            lm_argmax: false,
            gqa_lm: false,
            tc_lm: false,
            gu_fuse: false,
            norm_fold: false,
            moe_pwr: false,
            moe_shpf: false,
        }
    }
    pub fn default_set() -> KernelSet {
        KernelSet {
            tc_gemv: true,
            small_m: true,
            moe_s: true,
            attn_gqa: true,
            cublas: true,
            bf16_dense: false,
            bf16_moe: false,
            bf16_attn: false,
            moe_wide: true,
            moe_skip: true,
            moe_skip16: true,
            attn_ex2: true,
            attn_q: true,
            moe_sp: true,
            comb_norm: true,
            moe_silu: true,
            cublas_router: true,
            moe_mk: true,
            gqa_ld: true,
            qk_ld: true,
            attn_qk: true,
            swa_ns: true,
            qk_full: false,
            merge16: true,
            argmax_p: true,
            serve_argmax: true,
            merge64: true,
            tc_tl: true,
            attn_tc: true,
            attn_tc_swa: false,
            moe_dl: true,
            moe_x: true,
            samp_g: true,
            embed_norm: true,
            mk_final: true,
            tc_na: true,
            moe_na: true,
            sp_na: true,
            moe_poll: true,
            merge_r: true,
            moe_rp: true,
            moe_tc: true,
            tc_nst3: true,
            tc_s5: true,
            tc_bf: true,
            moe_dep: false,
            moe_gi: false,
            tc_pre: false,
            gqa_pre: false,
            tc_db: true,
            tc_dbq: false,
            silu_fold: true,
            gqa_cl: false,
            merge_o: false,
            lm_argmax: true,
            gqa_lm: false,
            tc_lm: false,
            gu_fuse: true,
            norm_fold: false,
            moe_pwr: true,
            moe_shpf: true,
        }
    }
    /// The default set changed by a LAGUNA_KERNELS value: `original`, or a comma list of
    /// families prefixed with `-` (off) or `+`/nothing (on). Err names an unknown family.
    pub fn parse(spec: &str) -> std::result::Result<KernelSet, String> {
        let mut k = KernelSet::default_set();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (on, name) = match item.strip_prefix('-') {
                Some(n) => (false, n),
                None => (true, item.strip_prefix('+').unwrap_or(item)),
            };
            match name {
                "original" => k = KernelSet::original(),
                "default" => k = KernelSet::default_set(),
                "tc_gemv" => k.tc_gemv = on,
                "small_m" => k.small_m = on,
                "moe_s" => k.moe_s = on,
                "attn_gqa" => k.attn_gqa = on,
                "cublas" => k.cublas = on,
                "bf16_dense" => k.bf16_dense = on,
                "bf16_moe" => k.bf16_moe = on,
                "bf16_attn" => k.bf16_attn = on,
                "moe_wide" => k.moe_wide = on,
                "moe_skip" => k.moe_skip = on,
                "moe_skip16" => k.moe_skip16 = on,
                "attn_ex2" => k.attn_ex2 = on,
                "attn_q" => k.attn_q = on,
                "moe_sp" => k.moe_sp = on,
                "comb_norm" => k.comb_norm = on,
                "moe_silu" => k.moe_silu = on,
                "cublas_router" => k.cublas_router = on,
                "moe_mk" => k.moe_mk = on,
                "gqa_ld" => k.gqa_ld = on,
                "qk_ld" => k.qk_ld = on,
                "attn_qk" => k.attn_qk = on,
                "swa_ns" => k.swa_ns = on,
                "qk_full" => k.qk_full = on,
                "merge16" => k.merge16 = on,
                "argmax_p" => k.argmax_p = on,
                "serve_argmax" => k.serve_argmax = on,
                "merge64" => k.merge64 = on,
                "tc_tl" => k.tc_tl = on,
                "attn_tc" => k.attn_tc = on,
                "attn_tc_swa" => k.attn_tc_swa = on,
                "moe_dl" => k.moe_dl = on,
                "moe_x" => k.moe_x = on,
                "samp_g" => k.samp_g = on,
                "embed_norm" => k.embed_norm = on,
                "mk_final" => k.mk_final = on,
                "tc_na" => k.tc_na = on,
                "moe_na" => k.moe_na = on,
                "sp_na" => k.sp_na = on,
                "moe_poll" => k.moe_poll = on,
                "merge_r" => k.merge_r = on,
                "moe_rp" => k.moe_rp = on,
                "moe_tc" => k.moe_tc = on,
                "tc_nst3" => k.tc_nst3 = on,
                "tc_s5" => k.tc_s5 = on,
                "tc_bf" => k.tc_bf = on,
                "moe_dep" => k.moe_dep = on,
                "moe_gi" => k.moe_gi = on,
                "tc_pre" => k.tc_pre = on,
                "gqa_pre" => k.gqa_pre = on,
                "tc_db" => k.tc_db = on,
                "tc_dbq" => k.tc_dbq = on,
                "silu_fold" => k.silu_fold = on,
                "gqa_cl" => k.gqa_cl = on,
                "merge_o" => k.merge_o = on,
                "lm_argmax" => k.lm_argmax = on,
                "gqa_lm" => k.gqa_lm = on,
                "tc_lm" => k.tc_lm = on,
                "gu_fuse" => k.gu_fuse = on,
                "norm_fold" => k.norm_fold = on,
                "moe_pwr" => k.moe_pwr = on,
                "moe_shpf" => k.moe_shpf = on,
                _ => return Err(format!("unknown kernel family `{name}` (known: original, default, tc_gemv, small_m, moe_s, attn_gqa, cublas, bf16_dense, bf16_moe, bf16_attn, moe_wide, moe_skip, moe_skip16, attn_ex2, attn_q, moe_sp, comb_norm, moe_silu, cublas_router, moe_mk, gqa_ld, qk_ld, attn_qk, swa_ns, qk_full, merge16, argmax_p, serve_argmax, merge64, tc_tl, attn_tc, attn_tc_swa, moe_dl, moe_x, samp_g, embed_norm, mk_final, tc_na, moe_na, sp_na, moe_poll, merge_r, moe_rp, moe_tc, tc_nst3, tc_s5, tc_bf, moe_dep, moe_gi, tc_pre, gqa_pre, tc_db, tc_dbq, silu_fold, gqa_cl, merge_o, lm_argmax, gqa_lm, tc_lm, gu_fuse, norm_fold, moe_pwr, moe_shpf)")),
            }
        }
        Ok(k)
    }
    /// The set as a device with `smem_per_sm` bytes of shared memory per SM runs it: `attn_q`,
    /// sized for 3 prefill-attention blocks of 69 KB an SM, falls back to `attention_prefill_x`
    /// (2 blocks of 35 KB) where they do not fit (GB10 has ~100 KB an SM).
    pub fn fit(mut self, smem_per_sm: u32) -> KernelSet {
        if smem_per_sm < 3 * (70 * 1024) {
            self.attn_q = false;
        }
        // attention_tc_qk3's dynamic shared memory, its ~2 KB of static and 1 KB reserved.
        if smem_per_sm < super::ATC_QK3_SMEM + 4 * 1024 {
            self.tc_nst3 = false;
        }
        self
    }
    pub fn from_env() -> KernelSet {
        match std::env::var("LAGUNA_KERNELS") {
            Ok(v) => KernelSet::parse(&v).unwrap_or_else(|e| {
                tracing::warn!("LAGUNA_KERNELS: {e}; using the default kernels");
                KernelSet::default_set()
            }),
            Err(_) => KernelSet::default_set(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_set_parses() {
        assert_eq!(KernelSet::parse("").unwrap(), KernelSet::default_set());
        assert_eq!(KernelSet::parse("original").unwrap(), KernelSet::original());
        let k = KernelSet::parse("-tc_gemv, -attn_gqa").unwrap();
        assert!(!k.tc_gemv && !k.attn_gqa && k.small_m && k.moe_s);
        let k = KernelSet::parse("original,+moe_s").unwrap();
        assert_eq!(
            k,
            KernelSet {
                moe_s: true,
                ..KernelSet::original()
            }
        );
        let k = KernelSet::parse("-cublas,+bf16_moe").unwrap();
        assert!(!k.cublas && k.bf16_moe && !k.bf16_dense && !k.bf16_attn && k.tc_gemv);
        assert!(KernelSet::default_set().cublas && !KernelSet::original().cublas);
        let k = KernelSet::parse("-moe_silu,-moe_skip").unwrap();
        assert!(!k.moe_silu && !k.moe_skip && k.moe_wide);
        let k = KernelSet::parse("-moe_skip16,-comb_norm,-moe_sp").unwrap();
        assert!(!k.moe_skip16 && !k.comb_norm && !k.moe_sp && k.moe_skip);
        // attn_q (3 prefill-attention blocks of 69 KB an SM) falls back on a GB10-sized SM.
        let k = KernelSet::default_set();
        assert_eq!(k.fit(228 * 1024), k);
        let g = k.fit(100 * 1024);
        assert!(g.attn_ex2 && !g.attn_q);
        let k = KernelSet::parse("-attn_ex2,-attn_q").unwrap();
        assert!(!k.attn_ex2 && !k.attn_q);
        let k = KernelSet::parse("-gqa_ld,-qk_ld").unwrap();
        assert!(
            !k.gqa_ld
                && !k.qk_ld
                && KernelSet::default_set().gqa_ld
                && KernelSet::default_set().qk_ld
                && !KernelSet::original().qk_ld
        );
        assert!(!KernelSet::default_set().qk_full && KernelSet::parse("+qk_full").unwrap().qk_full);
        let k = KernelSet::parse("-attn_qk,-swa_ns").unwrap();
        assert!(!k.attn_qk && !k.swa_ns && k.gqa_ld && KernelSet::default_set().attn_qk);
        assert!(KernelSet::default_set().swa_ns && !KernelSet::original().attn_qk);
        let k = KernelSet::parse("-moe_mk").unwrap();
        assert!(!k.moe_mk && KernelSet::default_set().moe_mk && k.moe_sp);
        let d = KernelSet::default_set();
        assert!(d.attn_ex2 && d.attn_q && d.moe_sp && d.moe_skip16 && d.comb_norm);
        assert!(d.merge64 && d.serve_argmax && !KernelSet::original().merge64);
        assert!(
            d.tc_tl && !KernelSet::original().tc_tl && !KernelSet::parse("-tc_tl").unwrap().tc_tl
        );
        let k = KernelSet::parse("+attn_tc_swa").unwrap();
        assert!(k.attn_tc && k.attn_tc_swa && !KernelSet::original().attn_tc);
        let k = KernelSet::parse("-attn_tc").unwrap();
        assert!(!k.attn_tc && !k.attn_tc_swa && k.attn_qk);
        let k = KernelSet::parse("-embed_norm,-mk_final").unwrap();
        assert!(!k.embed_norm && !k.mk_final && k.moe_mk);
        assert!(d.embed_norm && d.mk_final && !KernelSet::original().embed_norm);
        assert!(d.tc_na && !KernelSet::parse("-tc_na").unwrap().tc_na);
        assert!(d.moe_na && !KernelSet::parse("-moe_na").unwrap().moe_na);
        assert!(!KernelSet::original().tc_na && !KernelSet::original().moe_na);
        assert!(d.sp_na && !KernelSet::parse("-sp_na").unwrap().sp_na);
        assert!(!KernelSet::original().sp_na);
        assert!(d.moe_poll && !KernelSet::parse("-moe_poll").unwrap().moe_poll);
        assert!(!KernelSet::original().moe_poll);
        assert!(d.merge_r && !KernelSet::parse("-merge_r").unwrap().merge_r);
        assert!(d.moe_rp && !KernelSet::parse("-moe_rp").unwrap().moe_rp);
        assert!(!KernelSet::original().merge_r && !KernelSet::original().moe_rp);
        assert!(
            d.moe_tc
                && !KernelSet::parse("-moe_tc").unwrap().moe_tc
                && !KernelSet::original().moe_tc
        );
        assert!(d.tc_nst3 && !KernelSet::original().tc_nst3);
        assert!(
            d.tc_s5 && !KernelSet::original().tc_s5 && !KernelSet::parse("-tc_s5").unwrap().tc_s5
        );
        assert!(
            d.tc_bf && !KernelSet::original().tc_bf && !KernelSet::parse("-tc_bf").unwrap().tc_bf
        );
        assert!(!d.moe_dep && KernelSet::parse("+moe_dep").unwrap().moe_dep);
        assert!(!d.moe_gi && KernelSet::parse("+moe_gi").unwrap().moe_gi);
        assert!(!d.tc_pre && KernelSet::parse("+tc_pre").unwrap().tc_pre);
        assert!(!d.gqa_pre && KernelSet::parse("+gqa_pre").unwrap().gqa_pre);
        assert!(
            d.tc_db && !KernelSet::original().tc_db && !KernelSet::parse("-tc_db").unwrap().tc_db
        );
        assert!(!d.tc_dbq && KernelSet::parse("+tc_dbq").unwrap().tc_dbq);
        assert!(!d.gqa_cl && KernelSet::parse("+gqa_cl").unwrap().gqa_cl);
        assert!(
            d.silu_fold
                && !KernelSet::original().silu_fold
                && !KernelSet::parse("-silu_fold").unwrap().silu_fold
        );
        assert!(!d.merge_o && KernelSet::parse("+merge_o").unwrap().merge_o);
        assert!(
            d.lm_argmax
                && !KernelSet::original().lm_argmax
                && !KernelSet::parse("-lm_argmax").unwrap().lm_argmax
        );
        assert!(!d.gqa_lm && KernelSet::parse("+gqa_lm").unwrap().gqa_lm);
        assert!(!d.tc_lm && KernelSet::parse("+tc_lm").unwrap().tc_lm);
        assert!(
            d.gu_fuse
                && !KernelSet::original().gu_fuse
                && !KernelSet::parse("-gu_fuse").unwrap().gu_fuse
        );
        assert!(!d.norm_fold && KernelSet::parse("+norm_fold").unwrap().norm_fold);
        assert!(d.moe_pwr && !KernelSet::parse("-moe_pwr").unwrap().moe_pwr);
        assert!(d.moe_shpf && !KernelSet::parse("-moe_shpf").unwrap().moe_shpf);
        // attention_tc_qk3's 115 KB: kept on an H200's 228 KB an SM, off on GB10's 99 KB.
        assert!(d.fit(233_472).tc_nst3 && !d.fit(101_376).tc_nst3);
        let k = KernelSet::parse("-merge64,-serve_argmax").unwrap();
        assert!(!k.merge64 && !k.serve_argmax && k.merge16 && k.argmax_p);
        assert!(KernelSet::parse("-fast")
            .unwrap_err()
            .contains("unknown kernel family `fast`"));
    }
}
