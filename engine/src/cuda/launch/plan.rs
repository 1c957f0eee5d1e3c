//! What the engine's launches ask of a device for a model's shapes, without a device: for
//! every pass the engine runs (a decode step, DFlash verify and propose passes of 2..=16 rows, a
//! long prefill pass) the kernels the selects pick on `DevProps` and their threads, dynamic
//! shared memory and grids, from the same select / geometry functions the launchers call. The
//! GB10 audit (`laguna warmup --arch sm_121a --audit`, docs/design/gb10.md) judges them against
//! ptxas' report. Launches of fixed geometry (norms, routers, combines: at most 256 threads and
//! no dynamic shared memory but `moe_group`'s) are listed with the launchers' sizes.
use crate::config::{AttnKind, LagunaConfig, MlpKind};
use crate::cuda::launch::norm;
use crate::cuda::select::{self, attention as sa, DevProps};
use crate::cuda::{split_grid, tc_grid, ATT_CHUNK};
use laguna_kernels::audit::Ask;

/// What the plan needs of the compiled kernels: static shared memory (SPREAD padding) and the
/// blocks an SM holds (the sampler's blocks a row, the fused MoE's fit).
pub trait Kernels {
    fn static_smem(&self, name: &str) -> u32;
    fn blocks_per_sm(&self, name: &str, block: u32, dyn_smem: u32) -> u32;
}

/// A model and how the engine runs it.
pub struct Model<'a> {
    pub cfg: &'a LagunaConfig,
    /// The routed experts are NVFP4 (else BF16); attention, routers and the lm_head BF16.
    pub experts_fp4: bool,
    /// A DFlash draft: its passes see every row of the block (non-causal).
    pub noncausal: bool,
    pub label: &'a str,
}

struct Out<'a> {
    asks: Vec<Ask>,
    label: &'a str,
}

impl Out<'_> {
    fn ask(
        &mut self,
        kernel: &'static str,
        block: u32,
        dyn_smem: u32,
        grid: u64,
        co: bool,
        job: &str,
    ) {
        let job = format!("{} {job}", self.label);
        if !self.asks.iter().any(|a| {
            a.kernel == kernel
                && a.block == block
                && a.dyn_smem == dyn_smem
                && a.grid >= grid
                && a.coresident == co
        }) {
            self.asks.push(Ask {
                kernel,
                block,
                dyn_smem,
                grid,
                coresident: co,
                job,
            });
        }
    }
}

/// Every launch of `model`'s passes on `dev`, gemm_min_rows rows and up being a GEMM pass.
pub fn asks(model: &Model, dev: &DevProps, k: &dyn Kernels, gemm_min_rows: usize) -> Vec<Ask> {
    let mut o = Out {
        asks: vec![],
        label: model.label,
    };
    let mut rows: Vec<usize> = (1..=16).collect();
    rows.push(gemm_min_rows.max(512));
    for &m in &rows {
        let job = format!("m={m}");
        attention(&mut o, model, dev, k, m, gemm_min_rows, &job);
        linears(&mut o, model, dev, m, gemm_min_rows, &job);
        moe(&mut o, model, dev, k, m, gemm_min_rows, &job);
        sample(&mut o, model, dev, k, m, &job);
        fixed(&mut o, model, m, &job);
    }
    o.asks
}

/// Launches of fixed small geometry (threads a block from the row count at most), as the
/// launchers size them: the decode step's token write-back, DFlash's accept / scatter / taps,
/// the staged prefill's ring commit, the load-time tiling and the GEMM passes' BF16 split.
fn fixed(o: &mut Out, model: &Model, m: usize, job: &str) {
    let warps_of = |n: usize| (n.div_ceil(32) as u32).max(1) * 32;
    if model.noncausal {
        o.ask("copy_rows", 256, 0, 0, false, job);
        o.ask(
            "rmsnorm_taps",
            norm::norm_block(model.cfg.hidden_size),
            0,
            0,
            false,
            job,
        );
        return;
    }
    if m <= 16 {
        o.ask("decode_advance", warps_of(m), 0, 0, false, job);
        o.ask("spec_accept", 32, 0, 0, false, job);
        o.ask("scatter_drafts", warps_of(m), 0, 0, false, job);
    }
    o.ask("ring_commit", 64, 0, 0, false, job);
    o.ask("tile_bf16", 32, 0, 0, false, job);
    o.ask("split_bf16", 256, 0, 0, false, job);
    o.ask("copy_u4", 512, 0, 0, false, job);
}

fn attention(
    o: &mut Out,
    model: &Model,
    dev: &DevProps,
    k: &dyn Kernels,
    m: usize,
    gemm_min_rows: usize,
    job: &str,
) {
    let cfg = model.cfg;
    let gemm = m >= gemm_min_rows;
    for (li, l) in cfg.layers.iter().enumerate() {
        let window = match l.attn {
            AttnKind::Full => 0,
            AttnKind::Sliding => cfg.sliding_window.unwrap_or(0),
        };
        let s = sa::Shape {
            m,
            nh: l.num_heads,
            nkv: cfg.num_kv_heads,
            hd: cfg.head_dim,
            window,
            half: l.rope.rotary_dim / 2,
            fp8: false,
            solo: m == 1 && !model.noncausal,
            staged: false,
        };
        let job = format!("{job} layer {li}");
        for fp8 in [false, true] {
            let s = sa::Shape { fp8, ..s };
            if gemm && !model.noncausal && sa::flash_takes(&s) {
                let name = sa::prefill_kernel(fp8, dev);
                o.ask(name, 128, sa::big_smem(name), 0, false, &job);
                continue;
            }
            let dec = sa::select_decode(&s);
            if !dec.fused_qk {
                o.ask(sa::qk_kernel(fp8), 128, 0, 0, false, &job);
            }
            let heads = if dec.form == sa::Form::Head {
                s.nh
            } else {
                s.nkv
            };
            // One split (a short row), a 2K row's and a long context's splits (at most 64:
            // NSPLIT_TC, the default cap).
            let splits = match dec.form {
                sa::Form::Tc => [1, tc_grid(2048, 64), tc_grid(131_072, 64)],
                _ => {
                    let n = split_grid(64, ATT_CHUNK, window, model.noncausal);
                    [1, n, n]
                }
            };
            for nsplit in splits {
                let blocks = m * heads * nsplit;
                let (name, block) = sa::decode_kernel(&s, dec, blocks, dev);
                let pad = sa::spread_pad(name, dev.smem_per_sm, k.static_smem(name));
                let smem = sa::decode_smem(name, blocks, dev, pad);
                o.ask(name, block, smem, blocks as u64, false, &job);
                if nsplit > 1 {
                    o.ask(
                        sa::merge_kernel(dec.form, nsplit),
                        sa::merge_block(s.hd),
                        0,
                        0,
                        false,
                        &job,
                    );
                }
            }
        }
    }
}

fn linears(o: &mut Out, model: &Model, dev: &DevProps, m: usize, gemm_min_rows: usize, job: &str) {
    let cfg = model.cfg;
    let (h, hd, nkv) = (cfg.hidden_size, cfg.head_dim, cfg.num_kv_heads);
    let mut jobs: Vec<(usize, usize, bool)> = vec![(cfg.vocab_size, h, false)];
    for (li, l) in cfg.layers.iter().enumerate() {
        jobs.push((
            l.num_heads * hd + 2 * nkv * hd + cfg.gate_width(li),
            h,
            false,
        ));
        jobs.push((h, l.num_heads * hd, false));
        match l.mlp {
            MlpKind::Dense => {
                jobs.push((2 * cfg.intermediate_size, h, false));
                jobs.push((h, cfg.intermediate_size, false));
            }
            MlpKind::Sparse => jobs.push((cfg.num_experts, h, true)),
        }
    }
    for (n, kk, router) in jobs {
        let s = select::linear::Shape {
            m,
            n,
            k: kk,
            fp4: false,
            tiled: true,
        };
        if m >= gemm_min_rows {
            for cublas in [false, true] {
                if let select::linear::Gemm::Kernel(name) = select::linear::gemm(false, cublas) {
                    o.ask(name, 128, 0, 0, false, job);
                }
            }
        } else if !router && select::linear::tc_takes(&s) {
            let (name, warps) = select::linear::tc_kernel(&s, dev);
            o.ask(name, 32 * warps, 0, 0, false, job);
            if name == "linear_tc_bf16_tiled_row" {
                o.ask(
                    "linear_tc_bf16_tiled_row_silu",
                    32 * warps,
                    0,
                    0,
                    false,
                    job,
                );
            }
            if name == "linear_tc_bf16_tiled" && n == cfg.vocab_size {
                o.ask("linear_tc_bf16_tiled_argmax", 32 * warps, 0, 0, false, job);
            }
        } else {
            let (name, _, smem) = select::linear::simt_kernel(&s);
            o.ask(name, 256, smem, 0, false, job);
        }
    }
    o.ask(
        if m >= gemm_min_rows {
            "rmsnorm_split"
        } else {
            "rmsnorm"
        },
        norm::norm_block(h),
        0,
        0,
        false,
        job,
    );
    o.ask("embed_norm", norm::norm_block(h), 0, 0, false, job);
    o.ask("silu_mul", 256, 0, 0, false, job);
}

fn moe(
    o: &mut Out,
    model: &Model,
    dev: &DevProps,
    k: &dyn Kernels,
    m: usize,
    gemm_min_rows: usize,
    job: &str,
) {
    let cfg = model.cfg;
    if !cfg.layers.iter().any(|l| l.mlp == MlpKind::Sparse) {
        return;
    }
    let fp4 = model.experts_fp4;
    let s = select::moe::Shape {
        h: cfg.hidden_size,
        im: cfg.moe_intermediate_size,
        experts: cfg.num_experts,
        fp4,
        gate_fp4: fp4,
        down_fp4: fp4,
    };
    let kk = cfg.top_k + 1;
    let slots = m * kk;
    if m == 1 {
        let smem = select::moe::mk_smem(cfg).unwrap_or(0);
        let per_sm = ["moe_decode_fused", "moe_decode_fused_tc"]
            .iter()
            .map(|n| k.blocks_per_sm(n, select::moe::MK_BLOCK, smem))
            .min()
            .unwrap_or(0);
        // What the engine launches where a block fits; where none does, what it would have
        // asked (the audit then names the limit).
        let (grid, smem) = select::moe::mk_geom(cfg, dev.sms, per_sm.max(1)).unwrap_or((0, 0));
        if let Some(name) =
            select::moe::fused_decode(&s, 1, false, false, grid, select::moe::MK_BLOCK)
        {
            o.ask(
                name,
                select::moe::MK_BLOCK,
                smem,
                grid as u64,
                true,
                &format!("{job} (grid barrier)"),
            );
        }
    }
    o.ask("router_topk", 32, 0, 0, false, job);
    o.ask(
        "moe_group",
        (slots as u32).div_ceil(32).clamp(1, 32) * 32,
        8 * cfg.num_experts as u32,
        0,
        false,
        job,
    );
    if m >= gemm_min_rows {
        let g = select::moe::gemm(&s);
        o.ask(g.gate_up, 128, 0, 0, false, job);
        o.ask(g.down, 128, 0, 0, false, job);
        if !g.silu {
            o.ask("silu_mul_split", 256, 0, 0, false, job);
        }
    } else {
        let st = select::moe::stream(&s, m, slots, slots.min(cfg.num_experts), dev);
        o.ask(st.gate_up, st.block, st.gu_smem, 0, false, job);
        o.ask(st.down, st.block, st.dn_smem, 0, false, job);
        if st.tc {
            o.ask("moe_tc_bfrag_rows", 256, 0, 0, false, job);
        }
    }
    o.ask("moe_combine", 256, 0, 0, false, job);
    o.ask(
        "moe_combine_norm",
        norm::norm_block(cfg.hidden_size),
        0,
        0,
        false,
        job,
    );
}

fn sample(o: &mut Out, model: &Model, dev: &DevProps, k: &dyn Kernels, m: usize, job: &str) {
    if model.noncausal || m > 16 {
        return;
    }
    let per_sm = k.blocks_per_sm("sample_rows_split", select::sample::SPLIT_BLOCK, 0);
    let (name, grid, block) = select::sample::sampler_geom(m, per_sm, dev.sms);
    let co = name == "sample_rows_split";
    o.ask(
        name,
        block,
        0,
        grid.0 as u64 * grid.1 as u64,
        co,
        &format!("{job} sampler"),
    );
    o.ask("argmax_rows_split", 256, 0, 0, false, job);
    o.ask("argmax_rows", 1024, 0, 0, false, job);
    o.ask("argmax_fin", (m as u32).div_ceil(32) * 32, 0, 0, false, job);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::profile;

    /// Kernels of 64 registers and no static shared memory, occupancy by GB10's rules.
    struct Flat;
    impl Kernels for Flat {
        fn static_smem(&self, _: &str) -> u32 {
            0
        }
        fn blocks_per_sm(&self, _: &str, block: u32, dyn_smem: u32) -> u32 {
            let r = laguna_kernels::audit::Resources {
                regs: 64,
                ..Default::default()
            };
            laguna_kernels::audit::blocks_per_sm(&laguna_kernels::audit::GB10, &r, block, dyn_smem)
                .0
        }
    }

    fn xs() -> LagunaConfig {
        LagunaConfig::from_json_str(include_str!(
            "../../../../tests/fixtures/reference/laguna-xs-2.1-nvfp4.config.json"
        ))
        .unwrap()
    }

    #[test]
    fn xs_on_gb10_asks_within_gb10_limits() {
        let cfg = xs();
        let m = Model {
            cfg: &cfg,
            experts_fp4: true,
            noncausal: false,
            label: "xs",
        };
        let asks = asks(&m, &profile::GB10, &Flat, 32);
        let lim = laguna_kernels::audit::GB10;
        for a in &asks {
            assert!(a.block <= lim.max_threads_per_block, "{a:?}");
            assert!(a.dyn_smem <= lim.smem_per_block, "{a:?}");
        }
        let get = |k: &str| asks.iter().find(|a| a.kernel == k);
        // The fused MoE decode: one block an SM of GB10's 48, all resident.
        let f = get("moe_decode_fused_tc").expect("fused MoE asked");
        assert_eq!((f.grid, f.block, f.coresident), (48, 640, true));
        // 3 K/V stages need 115 KB an SM: not on GB10; nor the Q-in-smem prefill.
        assert!(get("attention_decode_tc_qk_3stage").is_none());
        assert!(get("attention_prefill_flash_qsmem").is_none());
        assert!(get("attention_prefill_flash").is_some());
        // The sampler's split form: every row's blocks resident on 48 SMs.
        let s = get("sample_rows_split").expect("split sampler asked");
        assert!(s.coresident && s.grid <= 48 * 3, "{s:?}");
    }

    #[test]
    fn dflash_draft_plans() {
        let cfg = LagunaConfig::from_json_str(include_str!(
            "../../../../tests/fixtures/reference/laguna-xs-2.1-dflash.config.json"
        ))
        .unwrap();
        let m = Model {
            cfg: &cfg,
            experts_fp4: false,
            noncausal: true,
            label: "draft",
        };
        let asks = asks(&m, &profile::GB10, &Flat, 32);
        // Non-causal: the split-KV decode forms at every row count, no fused q/k, no MoE.
        assert!(asks
            .iter()
            .any(|a| a.kernel.starts_with("qk_norm_rope_store")));
        assert!(!asks.iter().any(|a| a.kernel.starts_with("moe_")));
        assert!(!asks
            .iter()
            .any(|a| a.kernel.starts_with("attention_prefill")));
    }
}
