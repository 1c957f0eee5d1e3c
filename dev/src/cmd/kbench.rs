//! `laguna-dev kbench`: kernel micro-benchmarks at the Laguna-XS 2.1 decode shapes (device machines).
//! Each case is captured as a CUDA graph of `reps` launches (with PDL, as in a decode step) whose
//! weights rotate through buffers larger than L2, so every launch streams from HBM. Reports
//! microseconds per launch and the bytes it reads per second, next to `read_u4` (a read-only
//! stream of the same bytes) as the practical roofline for a kernel of that size. The NVFP4
//! expert kernels are also checked against a float64 host reference at these shapes, and the
//! fused kernels (`moe_decode_fused`, `attention_decode_gqa_qk`) bit for bit against the launches they replace.
//! Every launch goes through the engine's typed launchers (`laguna_engine::cuda::launch`), so
//! the kernels run with the argument lists the engine passes.
use super::synth::Rng;
use anyhow::{bail, Result};
use clap::Parser;
use laguna_engine::cuda::launch::attention::{
    self as att, Attn, Cache, FusedQk, Merge, QkStore, Rope,
};
use laguna_engine::cuda::launch::linear::{self as lin, Linear};
use laguna_engine::cuda::launch::moe::{self, DecodeFused, Down, GateUp, Groups, Stack, TopK};
use laguna_engine::cuda::launch::{norm, sample, Geom};
use laguna_engine::cuda::Dev;

#[derive(Parser, Debug)]
pub struct Args {
    /// Launches per timed graph.
    #[arg(long, default_value_t = 64)]
    reps: usize,
    /// Only the decode attention section (skips the GEMV and MoE sections).
    #[arg(long)]
    attn_only: bool,
    /// Only the MoE half of a decode layer (`moe_decode_fused` against the seven launches it
    /// replaces, and its phases; skips every other section).
    #[arg(long)]
    moe_only: bool,
}

fn rand_bytes(r: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(n);
    v
}

/// `n` f32 uniform in [-1, 1), little-endian bytes.
fn rand_f32s(r: &mut Rng, n: usize) -> Vec<u8> {
    rand_f32_in(r, n, -1.0, 2.0)
}

/// `n` f32 uniform in [lo, lo + span), little-endian bytes.
fn rand_f32_in(r: &mut Rng, n: usize, lo: f32, span: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|_| (lo + span * ((r.next() >> 40) as f32 / (1u64 << 24) as f32)).to_le_bytes())
        .collect()
}

/// `n` BF16 (truncated) uniform in [-0.05, 0.05), little-endian bytes.
fn rand_bf16_small(r: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| {
            let f = ((r.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            ((f.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

const INV_GS: f32 = 1.0 / 448.0;

/// One row of a BF16 GEMV: y[1, n] = x[1, k] . W^T, W at `w` (row-major or tiled).
fn bf16_gemv(w: u64, x: u64, y: u64, n: usize, k: usize) -> Linear {
    Linear {
        w,
        s: 0,
        inv_gs: 1.0,
        x,
        ldx: k as i32,
        y,
        ldy: n as i32,
        m: 1,
        n: n as i32,
        k: k as i32,
        acc: false,
    }
}

/// XS-2.1's expert stacks: (H, I, experts): 256 routed + the shared expert folded as expert 256.
const XS_EXPERTS: (usize, usize, usize) = (2048, 512, 257);

/// A random NVFP4 stack of XS_EXPERTS (E4M3 scales with every exponent, subnormals included, but
/// no NaN 0x7f / 0xff; 1 / global scale INV_GS) on the device, and the host copies of its codes
/// and scales.
fn expert_stack(d: &Dev, rng: &mut Rng) -> Result<(Stack, Vec<u8>, Vec<u8>)> {
    let (h, im, ne) = XS_EXPERTS;
    let (wbytes, sbytes) = (ne * im * h / 2, ne * im * h / 16);
    let codes = rand_bytes(rng, wbytes);
    let w = d.alloc(wbytes).map_err(e)?;
    d.htod(w, &codes).map_err(e)?;
    let sc: Vec<u8> = rand_bytes(rng, sbytes)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { b ^ 1 } else { b })
        .collect();
    let s = d.alloc(sbytes).map_err(e)?;
    d.htod(s, &sc).map_err(e)?;
    let inv = d.alloc(4 * ne).map_err(e)?;
    let v: Vec<u8> = (0..ne).flat_map(|_| INV_GS.to_le_bytes()).collect();
    d.htod(inv, &v).map_err(e)?;
    Ok((Stack { w, s, inv }, codes, sc))
}

fn e2m1_ref(c: u8) -> f64 {
    let m = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(c & 7) as usize];
    if c & 8 != 0 {
        -m
    } else {
        m
    }
}

fn e4m3_ref(b: u8) -> f64 {
    let (ex, m) = (((b >> 3) & 15) as i32, (b & 7) as f64);
    if ex == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(ex - 7)
    }
}

fn e<T: std::fmt::Debug>(x: T) -> anyhow::Error {
    anyhow::anyhow!("{x:?}")
}

/// Microseconds per launch of a graph of `reps` calls of `f(i)`.
fn time_graph(d: &Dev, reps: usize, f: &dyn Fn(usize) -> Result<()>) -> Result<f64> {
    d.begin_capture().map_err(e)?;
    for i in 0..reps {
        f(i)?;
    }
    let g = d.end_capture().map_err(e)?;
    g.launch().map_err(e)?;
    d.sync().map_err(e)?;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let a = d.event().map_err(e)?;
        g.launch().map_err(e)?;
        let b = d.event().map_err(e)?;
        b.sync().map_err(e)?;
        best = best.min(a.ms_to(&b) * 1e3 / reps as f64);
    }
    Ok(best)
}

fn dtoh_f32(d: &Dev, p: u64, n: usize) -> Result<Vec<f32>> {
    let mut b = vec![0u8; 4 * n];
    d.dtoh(&mut b, p).map_err(e)?;
    Ok(b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

pub fn run(a: Args) -> Result<()> {
    if let Err(err) = laguna_engine::cuda::gpu_available() {
        bail!("laguna-dev kbench needs a CUDA GPU: {err}");
    }
    let d = Dev::new(0).map_err(e)?;
    let reps = a.reps.max(4);
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut rows: Vec<(String, f64, f64)> = vec![];

    if a.moe_only {
        let mut stack = || expert_stack(&d, &mut rng).map(|s| s.0);
        let stacks = (stack()?, stack()?, stack()?);
        moe_layer(&d, &mut rng, reps, &mut rows, stacks)?;
        print_rows(rows);
        return Ok(());
    }
    // ---- the greedy argmax: argmax_rows_split against argmax_rows, bit for bit on the index -------
    argmax_check(&d, &mut rng, reps, &mut rows)?;

    // ---- the attention of a decode layer: default launches against attn_qk's ------------------
    attn_layer(&d, &mut rng, reps, &mut rows)?;
    if a.attn_only {
        print_rows(rows);
        return Ok(());
    }

    gemv_rows(&d, &mut rng, reps, &mut rows)?;

    let ((gate, up, down), hn) = expert_rows(&d, &mut rng, reps, &mut rows)?;
    // ---- the MoE half of a decode layer: moe_decode_fused against the seven launches it replaces ----
    moe_layer(&d, &mut rng, reps, &mut rows, (gate, up, down))?;

    let (h, _, _) = XS_EXPERTS;
    // ---- a tiny kernel: the floor of one graph node ------------------------------------------
    let nw = d.alloc(4 * h).map_err(e)?;
    d.htod(nw, &rand_f32s(&mut rng, h)).map_err(e)?;
    let hn2 = d.alloc(4 * h).map_err(e)?;
    let t = time_graph(&d, reps, &|_| {
        norm::rmsnorm(&d, &mut None, 1, 256, hn, 0, nw, hn2, h as i32, 1e-6, None).map_err(e)
    })?;
    rows.push((
        "rmsnorm 1 x 2048 (graph node floor)".into(),
        t,
        (8 * h) as f64 / t / 1e6,
    ));

    print_rows(rows);
    Ok(())
}

/// BF16 GEMV (one activation row) at the XS-2.1 shapes: `read_u4`, `read_tc_pattern` and
/// `linear_tc_bf16[_tiled]` at several warp counts; the tiled layout checked bit for bit.
fn gemv_rows(
    d: &Dev,
    rng: &mut Rng,
    reps: usize,
    rows: &mut Vec<(String, f64, f64)>,
) -> Result<()> {
    let sms = d.sms;
    // ---- BF16 GEMV (one activation row) -------------------------------------------------------
    let pool_bytes: usize = 1536 << 20;
    let wpool = d.alloc(pool_bytes).map_err(e)?;
    // Small BF16 values (0x3c00 = 0.0078125) everywhere: timing does not depend on them.
    d.memset_d32(wpool, 0x3c00_3c00, pool_bytes / 4)
        .map_err(e)?;
    let x = d.alloc(4 * 8192 * 8).map_err(e)?;
    d.htod(x, &rand_f32s(rng, 8192 * 8)).map_err(e)?;
    let y = d.alloc(4 * 100352 * 8).map_err(e)?;
    let sink = d.alloc(4 * 4096).map_err(e)?;
    let shapes: [(&str, usize, usize); 5] = [
        ("qkvg 64 heads", 10304, 2048),
        ("qkvg 48 heads", 8240, 2048),
        ("o_proj 64 heads", 2048, 8192),
        ("o_proj 48 heads", 2048, 6144),
        ("lm_head", 100352, 2048),
    ];
    for &(label, n, k) in &shapes {
        let bytes = n * k * 2;
        let slots = (pool_bytes / bytes).max(1);
        let off = move |i: usize| wpool + ((i % slots) * bytes) as u64;
        let t = time_graph(d, reps, &|i| {
            let g = Geom::new((sms * 4, 1, 1), 512, 0);
            lin::read_u4(d, &mut None, g, off(i), (bytes / 16) as u64, sink).map_err(e)
        })?;
        rows.push((
            format!("{label} N={n} K={k}: read_u4"),
            t,
            bytes as f64 / t / 1e6,
        ));
        // linear_tc_bf16's weight loads alone (read_tc_pattern): its own addresses, then the
        // same rounds reading each (16-row group, K tile) as one contiguous 1 KB piece.
        for (tiled, sw) in [(false, 4u32), (true, 4), (false, 16), (true, 16)] {
            let t = time_graph(d, reps, &|i| {
                let g = Geom::new(((n as u32).div_ceil(16), 1, 1), 32 * sw, 0);
                let (n, k) = (n as i32, k as i32);
                lin::read_tc_pattern(d, &mut None, g, off(i), n, k, sink, tiled).map_err(e)
            })?;
            rows.push((
                format!(
                    "{label} N={n} K={k}: read_tc_pattern S={sw} {}",
                    if tiled { "tiled" } else { "row-major" }
                ),
                t,
                bytes as f64 / t / 1e6,
            ));
        }
        // One launch of linear_tc_bf16 (or `name`: linear_tc_bf16_tiled reads the same bytes as a
        // tile-interleaved layout, a timing of that layout only) on the matrix at w, S warps.
        let tcn = |name: &'static str, w: u64, sw: u32| {
            let g = Geom::new(((n as u32).div_ceil(16), 1, 1), 32 * sw, 0);
            lin::linear(d, &mut None, name, g, &bf16_gemv(w, x, y, n, k)).map_err(e)
        };
        let tc = |w: u64, sw: u32| tcn("linear_tc_bf16", w, sw);
        // linear_tc_bf16_tiled on tile_bf16's copy of a random matrix against
        // linear_tc_bf16 on the matrix: the same bits (1 row; S = 4 and 16).
        if n <= 10304 {
            let wr = d.alloc(bytes).map_err(e)?;
            let wt = d.alloc(n.div_ceil(16) * 16 * k * 2).map_err(e)?;
            d.htod(wr, &rand_bf16_small(rng, n * k)).map_err(e)?;
            lin::tile_bf16(d, &mut None, wr, wt, n, k).map_err(e)?;
            let mut same = true;
            for sw in [4u32, 16] {
                tcn("linear_tc_bf16", wr, sw)?;
                d.sync().map_err(e)?;
                let a = dtoh_f32(d, y, n)?;
                d.memset_d32(y, 0, n).map_err(e)?;
                tcn("linear_tc_bf16_tiled", wt, sw)?;
                d.sync().map_err(e)?;
                let b = dtoh_f32(d, y, n)?;
                same &= a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
            }
            println!(
                "linear_tc_bf16_tiled on tile_bf16's copy vs linear_tc_bf16, {label} N={n} K={k}, S=4 and 16: {}",
                if same { "bit-identical" } else { "DIFFER" }
            );
            d.free(wr);
            d.free(wt);
        }
        // The same matrix every launch (L2-resident when it fits the 50 MB L2): what a GEMV
        // would gain from weights already in L2.
        if n <= 10304 {
            let sw: u32 = if n <= 2048 { 16 } else { 4 };
            let t = time_graph(d, reps, &|_| tc(wpool, sw))?;
            rows.push((
                format!("{label} N={n} K={k}: linear_tc_bf16 S={sw}, same weights (L2)"),
                t,
                bytes as f64 / t / 1e6,
            ));
        }
        for sw in [2u32, 4, 8, 16] {
            let t = time_graph(d, reps, &|i| tc(off(i), sw))?;
            rows.push((
                format!("{label} N={n} K={k}: linear_tc_bf16 S={sw}"),
                t,
                bytes as f64 / t / 1e6,
            ));
        }
        for sw in [4u32, 16] {
            let t = time_graph(d, reps, &|i| tcn("linear_tc_bf16_tiled", off(i), sw))?;
            rows.push((
                format!("{label} N={n} K={k}: linear_tc_bf16_tiled S={sw} (tiled layout)"),
                t,
                bytes as f64 / t / 1e6,
            ));
        }
    }
    d.free(wpool);
    Ok(())
}

/// NVFP4 experts, one row (8 routed + the shared expert folded as expert 256) and the DFlash
/// k = 6 verify regime (7 rows): the grouped and warp kernels checked against a float64
/// reference and against each other, then timed. Returns the expert stacks (for
/// [`moe_layer`]) and one row of activations.
fn expert_rows(
    d: &Dev,
    rng: &mut Rng,
    reps: usize,
    rows: &mut Vec<(String, f64, f64)>,
) -> Result<((Stack, Stack, Stack), u64)> {
    let sms = d.sms;
    // ---- NVFP4 experts, one row: 8 routed + the shared expert (folded as expert 256) ---------
    let (h, im, ne) = XS_EXPERTS;
    // Device stack (codes, scales, 1/global scale) and the host copies of codes and scales.
    let mut stack = || expert_stack(d, rng);
    let (gate, gate_c, gate_s) = stack()?;
    let (up, up_c, up_s) = stack()?;
    let (down, down_c, down_s) = stack()?;
    let kk = 9usize;
    let one = grouping(d, rng, reps, 1)?;
    let hn = one.x;
    let o4 = |p: u64, i: usize, per: usize| p + (4 * i * per) as u64;
    // The `_warp` kernels run in blocks of 128 threads, the `_grouped` ones of 256.
    let blk = |name: &str| if name.ends_with("_warp") { 128 } else { 256 };
    // Launch i's copy of the grouping.
    let groups = |i: usize, g: &Grp| Groups {
        expert: o4(g.ge, i, g.groups),
        start: o4(g.gs, i, g.groups),
        count: o4(g.gc, i, g.groups),
        perm: o4(g.perm, i, g.slots),
        meta: o4(g.meta, i, 1),
    };
    let gu = |name: &'static str, grid: u32, i: usize, g: &Grp| {
        let a = GateUp {
            gate,
            up,
            x: g.x,
            h: h as i32,
            im: im as i32,
            kk: kk as i32,
            groups: groups(i, g),
            act: g.act,
        };
        moe::gate_up(
            d,
            &mut None,
            name,
            Geom::new((grid, 1, 1), blk(name), 0),
            &a,
        )
        .map_err(e)
    };
    let dn = |name: &'static str, grid: u32, i: usize, g: &Grp| {
        let a = Down {
            down,
            act: g.act,
            h: h as i32,
            im: im as i32,
            groups: groups(i, g),
            out: g.out,
        };
        moe::down(
            d,
            &mut None,
            name,
            Geom::new((grid, 1, 1), blk(name), 0),
            &a,
        )
        .map_err(e)
    };
    // Grids as the engine launches them (layers.rs) for `slots` slots in `groups` groups.
    let s_grids = |g: &Grp| {
        (
            (sms * 2).min((g.slots * im / 2).div_ceil(8) as u32),
            (sms * 2).min((g.slots * h / 4).div_ceil(8) as u32),
        )
    };
    // (the engine sizes the `_sp` grids for min(slots, experts) groups: the count is on the device)
    let sp_grids = |g: &Grp| {
        let gr = g.slots.min(ne);
        (
            (gr * im / 2).div_ceil(4) as u32,
            (gr * h / 8).div_ceil(4) as u32,
        )
    };
    let (s_gu_grid, s_dn_grid) = s_grids(&one);
    let (act, out) = (one.act, one.out);
    // Correctness at the real shapes: launch 0 against a float64 host reference (exact NVFP4
    // dequantisation: E2M1 code x E4M3 block scale / global scale).
    gu("moe_gate_up_fp4_grouped", s_gu_grid, 0, &one)?;
    let act_d = dtoh_f32(d, act, kk * im)?;
    dn("moe_down_fp4_grouped", s_dn_grid, 0, &one)?;
    let out_d = dtoh_f32(d, out, kk * h)?;
    fp4_reference_check(
        d,
        hn,
        &act_d,
        &out_d,
        [(&gate_c, &gate_s), (&up_c, &up_s), (&down_c, &down_s)],
    )?;
    // The DFlash k = 6 verify regime: 7 rows, 56 routed experts + the shared one with 7 slots,
    // 6.3x the decode row's weight bytes a launch.
    let ver = grouping(d, rng, reps, 7)?;
    // moe_sp: the same per-slot arithmetic as `_s`, so the same bits (checked in both regimes;
    // reported, not fatal, so the timing rows still print).
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let word = |ok: bool| if ok { "bit-identical" } else { "DIFFER" };
    for (label, g) in [("1 row", &one), ("7 rows", &ver)] {
        let (sg, sd) = s_grids(g);
        let (pg, pd) = sp_grids(g);
        gu("moe_gate_up_fp4_grouped", sg, 0, g)?;
        let a_s = dtoh_f32(d, g.act, g.slots * im)?;
        dn("moe_down_fp4_grouped", sd, 0, g)?;
        let o_s = dtoh_f32(d, g.out, g.slots * h)?;
        gu("moe_gate_up_fp4_warp", pg, 0, g)?;
        let a_sp = dtoh_f32(d, g.act, g.slots * im)?;
        // down from the `_s` activations, so its check does not depend on gate/up's.
        let bytes: Vec<u8> = a_s.iter().flat_map(|v| v.to_le_bytes()).collect();
        d.htod(g.act, &bytes).map_err(e)?;
        dn("moe_down_fp4_warp", pd, 0, g)?;
        let o_sp = dtoh_f32(d, g.out, g.slots * h)?;
        println!(
            "moe_*_fp4_warp vs moe_*_fp4_grouped, {label}: gate_up+SiLU {}, down {}",
            word(same(&a_sp, &a_s)),
            word(same(&o_sp, &o_s))
        );
    }
    for (label, g) in [("1 row, 9 experts", &one), ("7 rows, 57 experts", &ver)] {
        let gu_bytes = (g.groups * 2 * im * (h / 2 + h / 16)) as f64;
        let dn_bytes = (g.groups * h * (im / 2 + im / 16)) as f64;
        let (sg, sd) = s_grids(g);
        let (pg, pd) = sp_grids(g);
        for (name, grid) in [
            ("moe_gate_up_fp4_grouped", sg),
            ("moe_gate_up_fp4_warp", pg),
        ] {
            let t = time_graph(d, reps, &|i| gu(name, grid, i, g))?;
            rows.push((
                format!("moe gate_up {label}: {name}"),
                t,
                gu_bytes / t / 1e6,
            ));
        }
        for (name, grid) in [("moe_down_fp4_grouped", sd), ("moe_down_fp4_warp", pd)] {
            let t = time_graph(d, reps, &|i| dn(name, grid, i, g))?;
            rows.push((format!("moe down {label}: {name}"), t, dn_bytes / t / 1e6));
        }
    }
    Ok(((gate, up, down), hn))
}

/// `reps` copies of `per` i32 values `f(i, j)` on the device (launch i reads copy i).
fn ints(d: &Dev, reps: usize, f: &dyn Fn(usize, usize) -> i32, per: usize) -> Result<u64> {
    let mut v = vec![];
    for i in 0..reps {
        for j in 0..per {
            v.extend_from_slice(&f(i, j).to_le_bytes());
        }
    }
    let p = d.alloc(v.len()).map_err(e)?;
    d.htod(p, &v).map_err(e)?;
    Ok(p)
}

// A grouping as the kernels read it, `reps` copies (launch i reads copy i): groups (expert,
// first slot in perm, slots), perm, meta; `x` rows of activations, `act` / `out` per slot.
struct Grp {
    ge: u64,
    gs: u64,
    gc: u64,
    perm: u64,
    meta: u64,
    groups: usize,
    slots: usize,
    x: u64,
    act: u64,
    out: u64,
}

/// `rows` rows of one sequence: 8 routed experts a row of one slot each (group j: expert
/// (8i + 37j) % 256, all distinct, slot 9 (j / 8) + j % 8), then the shared expert (256) with
/// the rows' slot 8; groups in that order, as the kernels read them.
fn grouping(d: &Dev, rng: &mut Rng, reps: usize, rows: usize) -> Result<Grp> {
    let (h, im, _) = XS_EXPERTS;
    let kk = 9usize;
    let (groups, slots) = (rows * 8 + 1, rows * kk);
    let sh = groups - 1;
    let g = Grp {
        ge: ints(
            d,
            reps,
            &|i, j| {
                if j == sh {
                    256
                } else {
                    ((8 * i + 37 * j) % 256) as i32
                }
            },
            groups,
        )?,
        gs: ints(d, reps, &|_, j| j as i32, groups)?,
        gc: ints(
            d,
            reps,
            &|_, j| if j == sh { rows as i32 } else { 1 },
            groups,
        )?,
        perm: ints(
            d,
            reps,
            &|_, j| {
                if j < sh {
                    ((j / 8) * kk + j % 8) as i32
                } else {
                    ((j - sh) * kk + 8) as i32
                }
            },
            slots,
        )?,
        meta: ints(d, reps, &|_, _| groups as i32, 1)?,
        groups,
        slots,
        x: d.alloc(4 * rows * h).map_err(e)?,
        act: d.alloc(4 * slots * im).map_err(e)?,
        out: d.alloc(4 * slots * h).map_err(e)?,
    };
    d.htod(g.x, &rand_f32s(rng, rows * h)).map_err(e)?;
    Ok(g)
}

/// Launch 0 of the grouped NVFP4 expert kernels (`act_d` after gate_up + SiLU, `out_d` after
/// down, one row `hn`) against a float64 host reference with exact NVFP4 dequantisation
/// (E2M1 code x E4M3 block scale / global scale), from the host copies of the gate, up and
/// down stacks' codes and scales.
fn fp4_reference_check(
    d: &Dev,
    hn: u64,
    act_d: &[f32],
    out_d: &[f32],
    host: [(&[u8], &[u8]); 3],
) -> Result<()> {
    let (h, im, _) = XS_EXPERTS;
    let kk = 9usize;
    let [(gate_c, gate_s), (up_c, up_s), (down_c, down_s)] = host;
    let xh: Vec<f64> = dtoh_f32(d, hn, h)?.into_iter().map(|v| v as f64).collect();
    let ex: Vec<usize> = (0..kk)
        .map(|j| if j == 8 { 256 } else { (37 * j) % 256 })
        .collect();
    let row = |c: &[u8],
               sc: &[u8],
               e_: usize,
               rows: usize,
               n: usize,
               k: usize,
               x: &dyn Fn(usize) -> f64|
     -> f64 {
        let r = e_ * rows + n;
        (0..k)
            .map(|i| {
                let b = c[r * k / 2 + i / 2];
                let code = if i % 2 == 0 { b & 15 } else { b >> 4 };
                e2m1_ref(code) * e4m3_ref(sc[r * k / 16 + i / 16]) * x(i)
            })
            .sum::<f64>()
            * INV_GS as f64
    };
    let (mut ea, mut eo) = (0f64, 0f64);
    let amax = act_d.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let omax = out_d.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    for (j, &ej) in ex.iter().enumerate() {
        for i in 0..im {
            let g = row(gate_c, gate_s, ej, im, i, h, &|k| xh[k]);
            let u = row(up_c, up_s, ej, im, i, h, &|k| xh[k]);
            let a_ref = g / (1.0 + (-g).exp()) * u;
            ea = ea.max((a_ref - act_d[j * im + i] as f64).abs() / amax);
        }
        for n in (0..h).step_by(7) {
            let o = row(down_c, down_s, ej, h, n, im, &|k| act_d[j * im + k] as f64);
            eo = eo.max((o - out_d[j * h + n] as f64).abs() / omax);
        }
    }
    println!("moe_*_fp4_s vs float64 reference (9 experts, XS-2.1 shapes): gate_up+SiLU max rel err {ea:.2e}, down {eo:.2e}");
    if ea > 1e-5 || eo > 1e-5 {
        bail!("the NVFP4 expert kernels disagree with the float64 reference ({ea:.2e} / {eo:.2e} > 1e-5)");
    }
    Ok(())
}

fn print_rows(rows: Vec<(String, f64, f64)>) {
    println!("| kernel | us / launch | TB/s |");
    println!("|---|---|---|");
    for (n, t, bw) in rows {
        println!("| {n} | {t:.2} | {bw:.2} |");
    }
}

/// `argmax_rows_split` (64 blocks a row, folded by a 64-bit atomicMax) against
/// `argmax_rows` (one block a row) on XS-sized rows (vocabulary 100,352): random rows, rows whose
/// maximum repeats at a later and an earlier index, one at the last index, rows of -inf, +0 / -0
/// maxima, NaN sprinkled in, and a row of NaN alone; the same index every time, over 3 launches
/// (the slots reset themselves). Then both timed on one row.
fn argmax_check(
    d: &Dev,
    rng: &mut Rng,
    reps: usize,
    rows: &mut Vec<(String, f64, f64)>,
) -> Result<()> {
    let v = 100352usize;
    let n = 10usize;
    let mut host: Vec<f32> = Vec::with_capacity(n * v);
    for r in 0..n {
        let row: Vec<f32> = rand_f32s(rng, v)
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * 8.0)
            .collect();
        host.extend(row);
        let base = r * v;
        let h = &mut host[base..base + v];
        match r {
            1 => {
                // the maximum at 70,000 and again at 90,000 and 5: index 5 wins
                h[70000] = 100.0;
                h[90000] = 100.0;
                h[5] = 100.0;
            }
            2 => h[v - 1] = 1000.0,
            3 => h.iter_mut().for_each(|x| *x = f32::NEG_INFINITY),
            4 => {
                h.iter_mut().for_each(|x| *x = -1.0 - x.abs());
                h[60000] = 0.0;
                h[30000] = -0.0;
            }
            5 => {
                for i in (0..v).step_by(97) {
                    h[i] = f32::NAN;
                }
            }
            6 => h.iter_mut().for_each(|x| *x = f32::NAN),
            7 => {
                h[1568] = 50.0; // the first index of the second block's chunk
                h[1567] = 50.0; // the last of the first block's: wins
            }
            _ => {}
        }
    }
    let bytes: Vec<u8> = host.iter().flat_map(|x| x.to_le_bytes()).collect();
    let lg = d.alloc(4 * n * v).map_err(e)?;
    d.htod(lg, &bytes).map_err(e)?;
    let (o1, o2) = (d.alloc(4 * n).map_err(e)?, d.alloc(4 * n).map_err(e)?);
    let slot = d.alloc(8 * n).map_err(e)?;
    let cnt = d.alloc(4 * n).map_err(e)?;
    d.memset_d32(slot, 0, 2 * n).map_err(e)?;
    d.memset_d32(cnt, 0, n).map_err(e)?;
    let one = |rows_: usize, out: u64| {
        sample::argmax_rows(d, &mut None, rows_ as u32, lg, v as i32, out).map_err(e)
    };
    let par = |rows_: usize, out: u64| {
        let n = rows_ as u32;
        sample::argmax_rows_split(d, &mut None, n, 64, lg, v as i32, out, slot, cnt).map_err(e)
    };
    let ints = |p: u64| -> Result<Vec<i32>> {
        let mut b = vec![0u8; 4 * n];
        d.dtoh(&mut b, p).map_err(e)?;
        Ok(b.chunks(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    one(n, o1)?;
    let a = ints(o1)?;
    let mut same = true;
    for _ in 0..3 {
        d.memset_d32(o2, 0, n).map_err(e)?;
        par(n, o2)?;
        d.sync().map_err(e)?;
        same &= ints(o2)? == a;
    }
    println!(
        "argmax_rows_split vs argmax_rows, {n} rows of {v} (ties, -inf, +-0, NaN), 3 launches: {} (indices {:?})",
        if same { "the same indices" } else { "DIFFER" },
        a
    );
    let t1 = time_graph(d, reps, &|_| one(1, o1))?;
    let t2 = time_graph(d, reps, &|_| par(1, o2))?;
    rows.push((
        "argmax of one 100,352-logit row: argmax_rows".into(),
        t1,
        (4 * v) as f64 / t1 / 1e6,
    ));
    rows.push((
        "argmax of one 100,352-logit row: argmax_rows_split".into(),
        t2,
        (4 * v) as f64 / t2 / 1e6,
    ));
    for p in [lg, o1, o2, slot, cnt] {
        d.free(p);
    }
    Ok(())
}

/// The attention of a decode layer at the XS-2.1 shape (64 query heads on 8 KV heads, head dim
/// 128, gate per head, no sink), one row at position 2,112: the unfused three launches
/// (`qk_norm_rope_store`, `attention_decode_gqa`, `attention_decode_merge16`) against `attn_qk`'s two
/// (`attention_decode_gqa_qk`, `attention_decode_merge16`), for a full-attention layer (paged pool, pages of 64)
/// and a sliding-window one (ring of 527 one-slot pages, window 512): the same bits (output row,
/// new K and V rows) from the same inputs, and the time of each chain and launch in a graph; and
/// the tensor-core chains (`attention_decode_tc` / `_qk` + `attention_decode_tc_merge16*`):
/// their largest difference from the default chain, `_qk` against the three launches bit for bit.
fn attn_layer(
    d: &Dev,
    rng: &mut Rng,
    reps: usize,
    rows: &mut Vec<(String, f64, f64)>,
) -> Result<()> {
    for (label, window, ps, max_pages, half, theta, factor, nsplit) in [
        (
            "full", 0usize, 64usize, 64usize, 32usize, 500000f32, 1.3466f32, 64usize,
        ),
        ("sliding 512", 512, 1, 527, 64, 10000.0, 1.0, 64),
        // the grid of a sliding layer sized by its window (the same splits).
        (
            "sliding 512, grid of 16 splits",
            512,
            1,
            527,
            64,
            10000.0,
            1.0,
            16,
        ),
    ] {
        let (c, q0) = AttnCase::new(
            d, rng, label, window, ps, max_pages, half, theta, factor, nsplit,
        )?;
        attn_bits(&c, &q0)?;
        attn_timings(&c, &q0, reps, rows)?;
        c.free();
    }
    Ok(())
}

/// One attention case of [`attn_layer`] at the XS-2.1 decode shape (64 query heads, 8 K/V
/// heads, head_dim 128, one row at position `p`): its device buffers and the launches of the
/// chains it compares and times.
#[derive(Clone, Copy)]
struct AttnCase<'a> {
    d: &'a Dev,
    nh: usize,
    nkv: usize,
    hd: usize,
    qw: usize,
    kvw: usize,
    g: usize,
    ld: usize,
    p: usize,
    label: &'static str,
    window: usize,
    ps: usize,
    max_pages: usize,
    half: usize,
    factor: f32,
    nsplit: usize,
    tc_ns: usize,
    kc: u64,
    vc: u64,
    bt: u64,
    q: u64,
    qn: u64,
    kn: u64,
    inv_freq: u64,
    pos: u64,
    seqrow: u64,
    out: u64,
    part: u64,
    kp: u64,
    vp: u64,
    gp: u64,
    scale: f32,
}

impl<'a> AttnCase<'a> {
    /// The buffers of one case (random K/V, q|k|v|g row, norms, rotary table) and the row's
    /// q|k|v|g values `q0`, so every chain can start from the same q.
    #[allow(clippy::too_many_arguments)]
    fn new(
        d: &'a Dev,
        rng: &mut Rng,
        label: &'static str,
        window: usize,
        ps: usize,
        max_pages: usize,
        half: usize,
        theta: f32,
        factor: f32,
        nsplit: usize,
    ) -> Result<(AttnCase<'a>, Vec<u8>)> {
        let (nh, nkv, hd) = (64usize, 8usize, 128usize);
        let (qw, kvw, g) = (nh * hd, nkv * hd, nh / nkv);
        let ld = qw + 2 * kvw + nh;
        let p = 2048 + 64usize;
        let buf = |bytes: &[u8]| -> Result<u64> {
            let p = d.alloc(bytes.len().max(4)).map_err(e)?;
            d.htod(p, bytes).map_err(e)?;
            Ok(p)
        };
        let bf16s = |rng: &mut Rng, n: usize| -> Vec<u8> {
            (0..n)
                .flat_map(|_| {
                    let f = (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    ((f.to_bits() >> 16) as u16).to_le_bytes()
                })
                .collect()
        };
        let ints = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let kc = buf(&bf16s(rng, max_pages * ps * kvw))?;
        let vc = buf(&bf16s(rng, max_pages * ps * kvw))?;
        let bt = buf(&ints(&(0..max_pages as i32).collect::<Vec<_>>()))?;
        let q0 = rand_f32_in(rng, ld, -1.0, 2.0);
        let q = buf(&q0)?;
        let qn = buf(&rand_f32_in(rng, hd, 0.5, 1.0))?;
        let kn = buf(&rand_f32_in(rng, hd, 0.5, 1.0))?;
        let inv_freq: Vec<u8> = (0..half)
            .flat_map(|i| theta.powf(-(i as f32) / half as f32).to_le_bytes())
            .collect();
        let inv_freq = buf(&inv_freq)?;
        let pos = buf(&ints(&[p as i32]))?;
        let seqrow = buf(&ints(&[0]))?;
        let out = buf(&vec![0u8; 4 * qw])?;
        let part = buf(&vec![0u8; 4 * nh * nsplit * (hd + 2)])?;
        let (kp, vp, gp) = (
            q + 4 * qw as u64,
            q + 4 * (qw + kvw) as u64,
            q + 4 * (qw + 2 * kvw) as u64,
        );
        let scale = 1.0 / (hd as f32).sqrt();
        // attention_decode_tc: the engine's grid of splits for it (64; a sliding layer's at most ceil(window / 64)); a row takes tc_splits of them.
        let tc_ns = {
            use laguna_engine::cuda::{nsplit_tc, split_grid, TC_CHUNK};
            split_grid(nsplit_tc(nsplit), TC_CHUNK, window, false)
        };
        let c = AttnCase {
            d,
            nh,
            nkv,
            hd,
            qw,
            kvw,
            g,
            ld,
            p,
            label,
            window,
            ps,
            max_pages,
            half,
            factor,
            nsplit,
            tc_ns,
            kc,
            vc,
            bt,
            q,
            qn,
            kn,
            inv_freq,
            pos,
            seqrow,
            out,
            part,
            kp,
            vp,
            gp,
            scale,
        };
        Ok((c, q0))
    }

    /// Where the layer's K/V live (the row's position and block table).
    fn cache(&self) -> Cache {
        Cache {
            pos: self.pos,
            seqrow: self.seqrow,
            bt: self.bt,
            max_pages: self.max_pages as i32,
            page_size: self.ps as i32,
            kc: self.kc,
            vc: self.vc,
        }
    }

    /// The arguments every decode attention starts with: gate per head, no sink, no K/V scales.
    fn attn(&self) -> Attn {
        Attn {
            q: self.q,
            ldq: self.ld as i32,
            out: self.out,
            ldo: self.qw as i32,
            cache: self.cache(),
            nh: self.nh as i32,
            nkv: self.nkv as i32,
            hd: self.hd as i32,
            window: self.window as i32,
            sink: 0,
            g: self.gp,
            ldg: self.ld as i32,
            gate_mode: 1,
            scale: self.scale,
            vscale: 1.0,
        }
    }

    /// The q/k norm + RoPE of the row.
    fn rope(&self) -> Rope {
        Rope {
            q_norm: self.qn,
            k_norm: self.kn,
            inv_freq: self.inv_freq,
            half: self.half as i32,
            attn_factor: self.factor,
            eps: 1e-6,
        }
    }

    /// The new K/V rows a `_qk` attention normes, rotates and writes itself.
    fn fused_qk(&self) -> FusedQk {
        FusedQk {
            k: self.kp,
            v: self.vp,
            ldkv: self.ld as i32,
            rope: self.rope(),
            kinv: 1.0,
            vinv: 1.0,
        }
    }

    fn qk(&self) -> Result<()> {
        let a = QkStore {
            q: self.q,
            ldq: self.ld as i32,
            k: self.kp,
            v: self.vp,
            ldkv: self.ld as i32,
            rope: self.rope(),
            cache: self.cache(),
            nh: self.nh as i32,
            nkv: self.nkv as i32,
            hd: self.hd as i32,
            ks: 0,
            vs: 0,
            kinv: 1.0,
            vinv: 1.0,
        };
        let g = Geom::new((1, (self.nh + self.nkv).div_ceil(4) as u32, 1), 128, 0);
        att::qk_norm_rope_store(self.d, &mut None, false, g, &a).map_err(e)
    }

    /// A split-KV decode attention `name` over `ns` splits, in blocks of `block` threads (`qk`:
    /// the `_qk` form, which writes the new K/V rows itself).
    fn decode(&self, name: &'static str, ns: usize, block: u32, smem: u32, qk: bool) -> Result<()> {
        let g = Geom::new((1, self.nkv as u32, ns as u32), block, smem);
        let f = self.fused_qk();
        let fq = qk.then_some(&f);
        let a = self.attn();
        att::decode(
            self.d, &mut None, name, g, &a, ns as i32, self.part, fq, 0, [0; 3],
        )
        .map_err(e)
    }

    fn gqa(&self) -> Result<()> {
        let block = 32 * self.g as u32;
        self.decode("attention_decode_gqa", self.nsplit, block, 0, false)
    }

    fn fused(&self, name: &'static str) -> Result<()> {
        let block = 32 * (self.g as u32 + 1);
        self.decode(name, self.nsplit, block, 0, true)
    }

    /// attention_decode_tc (qk false: after qk_norm_rope_store) or attention_decode_tc_qk (the norms inside).
    fn tc_launch(&self, qk: bool) -> Result<()> {
        let name = if qk {
            "attention_decode_tc_qk"
        } else {
            "attention_decode_tc"
        };
        let smem = laguna_engine::cuda::big_smem(name);
        self.decode(name, self.tc_ns, 128, smem, qk)
    }

    fn tc(&self) -> Result<()> {
        self.tc_launch(false)
    }

    fn tc_qk(&self) -> Result<()> {
        self.tc_launch(true)
    }

    fn merge_n(&self, name: &'static str, ns: usize) -> Result<()> {
        let a = Merge {
            part: self.part,
            nsplit: ns as i32,
            out: self.out,
            ldo: self.qw as i32,
            nh: self.nh as i32,
            hd: self.hd as i32,
            sink: 0,
            g: self.gp,
            ldg: self.ld as i32,
            gate_mode: 1,
            pos: self.pos,
            window: self.window as i32,
            kend: 0,
            vscale: 1.0,
        };
        let g = Geom::new((1, self.nh as u32, 1), self.hd as u32, 0);
        att::merge(self.d, &mut None, name, g, &a).map_err(e)
    }

    fn merge(&self, name: &'static str) -> Result<()> {
        self.merge_n(name, self.nsplit)
    }

    fn merge_tc(&self) -> Result<()> {
        self.merge_n(
            if self.tc_ns > 16 {
                "attention_decode_tc_merge64"
            } else {
                "attention_decode_tc_merge16"
            },
            self.tc_ns,
        )
    }

    /// The same merges again (kept for the timing rows).
    fn merge_tcr(&self) -> Result<()> {
        self.merge_n(
            if self.tc_ns > 16 {
                "attention_decode_tc_merge64"
            } else {
                "attention_decode_tc_merge16"
            },
            self.tc_ns,
        )
    }

    /// The K or V row (cache `c`) the step wrote, as bytes.
    fn row(&self, c: u64) -> Result<Vec<u8>> {
        let AttnCase {
            d,
            kvw,
            window,
            p,
            max_pages,
            ..
        } = *self;
        let slot = if window > 0 { p % max_pages } else { p };
        let mut b = vec![0u8; 2 * kvw];
        d.dtoh(&mut b, c + (2 * slot * kvw) as u64).map_err(e)?;
        Ok(b)
    }

    fn free(&self) {
        let AttnCase {
            d,
            kc,
            vc,
            bt,
            q,
            qn,
            kn,
            inv_freq,
            pos,
            seqrow,
            out,
            part,
            ..
        } = *self;
        for x in [kc, vc, bt, q, qn, kn, inv_freq, pos, seqrow, out, part] {
            d.free(x);
        }
    }
}

/// Bits: the chains of [`attn_layer`] from the same q (the default chain norms q in place),
/// printed against the default chain.
fn attn_bits(c: &AttnCase, q0: &[u8]) -> Result<()> {
    let AttnCase {
        d,
        q,
        out,
        qw,
        kc,
        vc,
        label,
        p,
        tc_ns,
        ..
    } = *c;
    let mut got = vec![];
    let variants: [(Option<&'static str>, &'static str); 3] = [
        (None, "attention_decode_merge16"),
        (Some("attention_decode_gqa_qk"), "attention_decode_merge16"),
        (None, "attention_decode_merge64"),
    ];
    for (f, mname) in variants {
        d.htod(q, q0).map_err(e)?;
        if let Some(fname) = f {
            c.fused(fname)?;
        } else {
            c.qk()?;
            c.gqa()?;
        }
        c.merge(mname)?;
        d.sync().map_err(e)?;
        let o: Vec<u32> = dtoh_f32(d, out, qw)?
            .into_iter()
            .map(f32::to_bits)
            .collect();
        got.push((o, c.row(kc)?, c.row(vc)?));
    }
    let a = &got[0];
    for (b, name) in got[1..].iter().zip([
        "attention_decode_gqa_qk + attention_decode_merge16",
        "qk_norm_rope_store + attention_decode_gqa + attention_decode_merge64",
    ]) {
        println!(
            "{name} vs qk_norm_rope_store + attention_decode_gqa + attention_decode_merge16, {label}, XS-2.1 shape at {p}: output {}, K row {}, V row {}",
            if a.0 == b.0 { "bit-identical" } else { "DIFFERS" },
            if a.1 == b.1 { "bit-identical" } else { "DIFFERS" },
            if a.2 == b.2 { "bit-identical" } else { "DIFFERS" }
        );
    }
    // attention_decode_tc + attention_decode_tc_merge16: other arithmetic (tensor cores, its own splits), so
    // its output against the default chain's as the largest difference relative to the
    // largest output; K / V rows are written by the same qk_norm_rope_store.
    {
        d.htod(q, q0).map_err(e)?;
        c.qk()?;
        c.tc()?;
        c.merge_tc()?;
        d.sync().map_err(e)?;
        let o = dtoh_f32(d, out, qw)?;
        let (mut dmax, mut mag) = (0f32, 0f32);
        for (x, y) in o.iter().zip(&a.0) {
            let y = f32::from_bits(*y);
            dmax = if x.is_finite() {
                dmax.max((x - y).abs())
            } else {
                f32::INFINITY
            };
            mag = mag.max(y.abs());
        }
        println!(
            "qk_norm_rope_store + attention_decode_tc + attention_decode_tc_merge16 (grid of {tc_ns} splits) vs the default chain, {label}, XS-2.1 shape at {p}: largest difference {:.2e} of the largest output{}, K row {}, V row {}",
            dmax / mag,
            if dmax / mag < 1e-4 { "" } else { " (TOO LARGE)" },
            if a.1 == c.row(kc)? { "bit-identical" } else { "DIFFERS" },
            if a.2 == c.row(vc)? { "bit-identical" } else { "DIFFERS" }
        );
        // attention_decode_tc_qk (the norms inside the launch) against the three launches: the same bits.
        let t3: Vec<u32> = o.iter().map(|x| x.to_bits()).collect();
        d.htod(q, q0).map_err(e)?;
        c.tc_qk()?;
        c.merge_tc()?;
        d.sync().map_err(e)?;
        let o2: Vec<u32> = dtoh_f32(d, out, qw)?
            .into_iter()
            .map(f32::to_bits)
            .collect();
        println!(
            "attention_decode_tc_qk + attention_decode_tc_merge16 vs qk_norm_rope_store + attention_decode_tc + attention_decode_tc_merge16, {label}, XS-2.1 shape at {p}: output {}, K row {}, V row {}",
            if o2 == t3 { "bit-identical" } else { "DIFFERS" },
            if a.1 == c.row(kc)? { "bit-identical" } else { "DIFFERS" },
            if a.2 == c.row(vc)? { "bit-identical" } else { "DIFFERS" }
        );
        // merge_r's form of the tensor-core merge on the same partials: the same bits.
        c.merge_tcr()?;
        d.sync().map_err(e)?;
        let o3: Vec<u32> = dtoh_f32(d, out, qw)?
            .into_iter()
            .map(f32::to_bits)
            .collect();
        println!(
            "attention_decode_tc_qk + attention_decode_tc_merge16(64)r vs attention_decode_tc_qk + attention_decode_tc_merge16(64), {label}, XS-2.1 shape at {p}: output {}",
            if o3 == t3 { "bit-identical" } else { "DIFFERS" }
        );
    }
    Ok(())
}

/// The timing rows of [`attn_layer`]'s chains for one case.
fn attn_timings(
    c: &AttnCase,
    q0: &[u8],
    reps: usize,
    rows: &mut Vec<(String, f64, f64)>,
) -> Result<()> {
    let AttnCase {
        d,
        q,
        kvw,
        label,
        p,
        window,
        ..
    } = *c;
    d.htod(q, q0).map_err(e)?;
    let keys = if window > 0 { window } else { p + 1 };
    let bytes = (keys * kvw * 2 * 2) as f64;
    let chains: [(&str, &dyn Fn() -> Result<()>); 19] = [
        (
            "qk_norm_rope_store + attention_decode_gqa + attention_decode_merge16",
            &|| {
                c.qk()?;
                c.gqa()?;
                c.merge("attention_decode_merge16")
            },
        ),
        (
            "attention_decode_gqa_qk + attention_decode_merge16",
            &|| {
                c.fused("attention_decode_gqa_qk")?;
                c.merge("attention_decode_merge16")
            },
        ),
        ("qk_norm_rope_store alone", &|| c.qk()),
        ("attention_decode_gqa alone", &|| c.gqa()),
        ("attention_decode_gqa_qk alone", &|| {
            c.fused("attention_decode_gqa_qk")
        }),
        ("attention_decode_merge16 alone", &|| {
            c.merge("attention_decode_merge16")
        }),
        (
            "attention_decode_gqa_qk + attention_decode_merge16",
            &|| {
                c.fused("attention_decode_gqa_qk")?;
                c.merge("attention_decode_merge16")
            },
        ),
        ("attention_decode_merge16 alone", &|| {
            c.merge("attention_decode_merge16")
        }),
        (
            "qk_norm_rope_store + attention_decode_gqa + attention_decode_merge64",
            &|| {
                c.qk()?;
                c.gqa()?;
                c.merge("attention_decode_merge64")
            },
        ),
        ("attention_decode_merge64 alone", &|| {
            c.merge("attention_decode_merge64")
        }),
        (
            "qk_norm_rope_store + attention_decode_tc + attention_decode_tc_merge16",
            &|| {
                c.qk()?;
                c.tc()?;
                c.merge_tc()
            },
        ),
        ("attention_decode_tc alone", &|| c.tc()),
        (
            "attention_decode_tc_qk + attention_decode_tc_merge16",
            &|| {
                c.tc_qk()?;
                c.merge_tc()
            },
        ),
        ("attention_decode_tc_qk alone", &|| c.tc_qk()),
        ("attention_decode_tc_merge16 alone", &|| c.merge_tc()),
        (
            "attention_decode_gqa_qk + attention_decode_merge16",
            &|| {
                c.fused("attention_decode_gqa_qk")?;
                c.merge("attention_decode_merge16")
            },
        ),
        ("attention_decode_merge16 alone", &|| {
            c.merge("attention_decode_merge16")
        }),
        (
            "attention_decode_tc_qk + attention_decode_tc_merge16(64)r",
            &|| {
                c.tc_qk()?;
                c.merge_tcr()
            },
        ),
        ("attention_decode_tc_merge16(64)r alone", &|| c.merge_tcr()),
    ];
    for (name, f) in chains {
        let t = time_graph(d, reps, &|_| f())?;
        rows.push((
            format!("attention {label} at {p}: {name}"),
            t,
            bytes / t / 1e6,
        ));
    }
    Ok(())
}

/// `moe_decode_fused` at the XS-2.1 shape against the seven launches it replaces
/// (rmsnorm, router GEMV, top-k, gate/up, down, combine, the next layer's rmsnorm): the same bits
/// (residual, next layer's normed row, routing) from the same inputs, time per layer in a graph
/// (each launch its own router matrix, so the picks and the expert bytes read change as in a
/// decode step), and moe_decode_fused's phases and barriers from its globaltimer stamps.
fn moe_layer(
    d: &Dev,
    rng: &mut Rng,
    reps: usize,
    rows: &mut Vec<(String, f64, f64)>,
    stacks: (Stack, Stack, Stack),
) -> Result<()> {
    let (c, x0) = MoeCase::new(d, rng, reps, stacks)?;
    moe_bits(&c, &x0)?;
    moe_timings(&c, &x0, rows)?;
    for vname in ["moe_decode_fused", "moe_decode_fused_tc"] {
        moe_phases(&c, vname)?;
    }
    c.free();
    Ok(())
}

/// [`moe_layer`]'s inputs at the XS-2.1 shape (H 2048, I 512, 256 experts, top-8 + the shared
/// expert): the device buffers, and the two ways it runs a layer's MoE half.
#[derive(Clone, Copy)]
struct MoeCase<'a> {
    d: &'a Dev,
    h: usize,
    im: usize,
    e_n: usize,
    k: usize,
    kk: usize,
    eps: f32,
    scale: f32,
    nb: u32,
    reps: usize,
    rw: u64,
    rw_bytes: usize,
    bias: u64,
    post_w: u64,
    next_w: u64,
    x: u64,
    hn: u64,
    hn2: u64,
    rlog: u64,
    ids: u64,
    wts: u64,
    act: u64,
    out: u64,
    ge: u64,
    gs: u64,
    gc: u64,
    perm: u64,
    meta: u64,
    gbar: u64,
    tp: u64,
    smem: u32,
    stag: i32,
    rlog_mk: u64,
    xf: u64,
    gate: Stack,
    up: Stack,
    down: Stack,
}

impl<'a> MoeCase<'a> {
    /// Random router matrices (one a launch), bias and norm weights, a residual row `x0`, and
    /// zeroed work buffers.
    fn new(
        d: &'a Dev,
        rng: &mut Rng,
        reps: usize,
        (gate, up, down): (Stack, Stack, Stack),
    ) -> Result<(MoeCase<'a>, Vec<u8>)> {
        let (h, im, e_n, k, kk) = (2048usize, 512usize, 256usize, 8usize, 9usize);
        let (eps, scale) = (1e-6f32, 2.5f32);
        let nb = (h.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32;
        let buf = |bytes: &[u8]| -> Result<u64> {
            let p = d.alloc(bytes.len()).map_err(e)?;
            d.htod(p, bytes).map_err(e)?;
            Ok(p)
        };
        // Router matrices (BF16 in [-0.05, 0.05)), one a launch; bias small; norms' weights ~1.
        let rw_bytes = e_n * h * 2;
        let rw_all = rand_bf16_small(rng, reps * e_n * h);
        let rw = buf(&rw_all)?;
        let bias = buf(&rand_f32_in(rng, e_n, -0.01, 0.02))?;
        let post_w = buf(&rand_f32_in(rng, h, 0.5, 1.0))?;
        let next_w = buf(&rand_f32_in(rng, h, 0.5, 1.0))?;
        let x0 = rand_f32_in(rng, h, -1.0, 2.0);
        let x = buf(&x0)?;
        let z = |n: usize| -> Result<u64> {
            let p = d.alloc(n.max(4)).map_err(e)?;
            d.memset_d32(p, 0, n.max(4) / 4).map_err(e)?;
            Ok(p)
        };
        let (hn, hn2, rlog) = (z(4 * h)?, z(4 * h)?, z(4 * e_n)?);
        let (ids, wts, act, out) = (z(4 * 32)?, z(4 * 32)?, z(4 * kk * im)?, z(4 * kk * h)?);
        let (ge, gs, gc, perm, meta) = (z(4 * 32)?, z(4 * 32)?, z(4 * 32)?, z(4 * 32)?, z(16)?);
        let gbar = z(16)?;
        let tp = z(8 * 16 * reps)?;
        let smem = (4 * (h + kk * im)) as u32;
        // moe_decode_fused's gate/up issue stagger (ns a warp index): off here (the engine derives
        // its own from the memory bandwidth, `mk_stagger`).
        let stag: i32 = 0;
        // The fused launches' own logits buffer: unset (all bits 1) before each launch, as each leaves it.
        let rlog_mk = z(4 * e_n)?;
        d.memset_d32(rlog_mk, 0xFFFF_FFFF, e_n).map_err(e)?;
        // (tc: the multi-row tensor-core form, moe_tc: the row's B fragments, then
        // moe_gate_up_fp4_tc / moe_down_fp4_tc instead of moe_*_fp4_sp.)
        let xf = z(4 * h)?;
        let c = MoeCase {
            d,
            h,
            im,
            e_n,
            k,
            kk,
            eps,
            scale,
            nb,
            reps,
            rw,
            rw_bytes,
            bias,
            post_w,
            next_w,
            x,
            hn,
            hn2,
            rlog,
            ids,
            wts,
            act,
            out,
            ge,
            gs,
            gc,
            perm,
            meta,
            gbar,
            tp,
            smem,
            stag,
            rlog_mk,
            xf,
            gate,
            up,
            down,
        };
        Ok((c, x0))
    }

    /// Launch `i`'s router matrix.
    fn rwi(&self, i: usize) -> u64 {
        self.rw + ((i % self.reps) * self.rw_bytes) as u64
    }

    /// `moe_decode_fused[_tc]` (`name`) on launch `i`'s router, phase stamps to `tpp` (0: none),
    /// logits in `rl`.
    fn block_r(&self, name: &'static str, i: usize, tpp: u64, rl: u64) -> Result<()> {
        let MoeCase {
            d,
            h,
            im,
            eps,
            scale,
            nb,
            post_w,
            next_w,
            x,
            hn2,
            ids,
            wts,
            act,
            out,
            gbar,
            smem,
            stag,
            gate,
            up,
            down,
            ..
        } = *self;
        let a = DecodeFused {
            x,
            post_w,
            eps,
            nb: nb as i32,
            router: self.rwi(i),
            rlog: rl,
            topk: self.topk(),
            gate,
            up,
            down,
            h: h as i32,
            im: im as i32,
            act,
            out,
            ids,
            wts,
            scale,
            bar: gbar,
            next_w,
            hn_out: hn2,
            tp: tpp,
            stag,
        };
        let g = Geom::new((d.sms, 1, 1), 640, smem);
        moe::decode_fused(d, &mut None, name, g, &a).map_err(e)
    }

    /// XS-2.1's router rule: sigmoid scores + bias, top-8 renormalised, the shared expert as
    /// slot 8, no softcap.
    fn topk(&self) -> TopK {
        TopK {
            bias: self.bias,
            experts: self.e_n as i32,
            k: self.k as i32,
            softcap: 0.0,
            norm_topk: 1,
            shared_slot: 1,
            inv_scale: 1.0 / self.scale,
        }
    }

    /// The seven launches a fused launch replaces (tc: the multi-row tensor-core expert
    /// launches instead of the warp ones), on launch `i`'s router.
    fn seven(&self, i: usize, tc: bool) -> Result<()> {
        let MoeCase {
            d,
            h,
            im,
            e_n,
            kk,
            eps,
            scale,
            nb,
            post_w,
            next_w,
            x,
            hn,
            hn2,
            rlog,
            ids,
            wts,
            act,
            out,
            ge,
            gs,
            gc,
            perm,
            meta,
            xf,
            gate,
            up,
            down,
            ..
        } = *self;
        let rms = |w: u64, y: u64| {
            norm::rmsnorm(d, &mut None, 1, nb, x, 0, w, y, h as i32, eps, None).map_err(e)
        };
        rms(post_w, hn)?;
        let g = Geom::new((e_n.div_ceil(16) as u32, 1, 1), 256, (h * 4) as u32);
        let router = bf16_gemv(self.rwi(i), hn, rlog, e_n, h);
        lin::linear(d, &mut None, "linear_bf16_1", g, &router).map_err(e)?;
        let groups = Groups {
            expert: ge,
            start: gs,
            count: gc,
            perm,
            meta,
        };
        moe::router_topk(d, &mut None, 1, rlog, &self.topk(), ids, wts, Some(&groups))
            .map_err(e)?;
        let gb = (kk * im / 2).div_ceil(4) as u32;
        if tc {
            moe::tc_bfrag_rows(d, &mut None, 1, hn, xf).map_err(e)?;
        }
        let (gu_name, dn_name) = if tc {
            ("moe_gate_up_fp4_tc", "moe_down_fp4_tc")
        } else {
            ("moe_gate_up_fp4_warp", "moe_down_fp4_warp")
        };
        let gu = GateUp {
            gate,
            up,
            x: if tc { xf } else { hn },
            h: h as i32,
            im: im as i32,
            kk: kk as i32,
            groups,
            act,
        };
        moe::gate_up(d, &mut None, gu_name, Geom::new((gb, 1, 1), 128, 0), &gu).map_err(e)?;
        let db = (kk * h / 8).div_ceil(4) as u32;
        let dn = Down {
            down,
            act,
            h: h as i32,
            im: im as i32,
            groups,
            out,
        };
        moe::down(d, &mut None, dn_name, Geom::new((db, 1, 1), 128, 0), &dn).map_err(e)?;
        let combine = moe::Combine {
            x,
            out,
            wts,
            shared: 0,
            h: h as i32,
            kk: kk as i32,
            scale,
        };
        moe::combine(d, &mut None, 1, &combine, None).map_err(e)?;
        rms(next_w, hn2)
    }

    fn free(&self) {
        let MoeCase {
            d,
            rw,
            bias,
            post_w,
            next_w,
            x,
            hn,
            hn2,
            rlog,
            ids,
            wts,
            act,
            out,
            ge,
            gs,
            gc,
            perm,
            meta,
            gbar,
            tp,
            xf,
            ..
        } = *self;
        for p in [
            rw, bias, post_w, next_w, x, hn, hn2, rlog, ids, wts, act, out, ge, gs, gc, perm, meta,
            gbar, tp, xf,
        ] {
            d.free(p);
        }
    }
}

/// Same inputs, same bits: the seven launches, moe_decode_fused, moe_decode_fused_tc and the
/// multi-row tensor-core launches on four router matrices from the same residual row `x0`.
fn moe_bits(c: &MoeCase, x0: &[u8]) -> Result<()> {
    let MoeCase {
        d,
        h,
        im,
        e_n,
        kk,
        x,
        hn2,
        ids,
        wts,
        act,
        out,
        rlog_mk,
        ..
    } = *c;
    // Same inputs, same bits: four router matrices, each from the same residual row.
    let ints = |p: u64, n: usize| -> Result<Vec<i32>> {
        let mut b = vec![0u8; 4 * n];
        d.dtoh(&mut b, p).map_err(e)?;
        Ok(b.chunks(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<u32>>();
    let mut differ = vec![];
    // moe_decode_fused_tc (moe_tc): other bits by design; its routing must be the same bits and its
    // layer update within float64-agreement distance of the seven launches'.
    let (mut tc_upd, mut tc_norm, mut tc_act, mut tc_out) = (0f64, 0f64, 0f64, 0f64);
    let tc_name: &'static str = "moe_decode_fused_tc";
    for i in 0..4 {
        // 0: the seven launches, 5: moe_decode_fused, 6: moe_decode_fused_tc, 7: the
        // multi-row tensor-core launches.
        let mut got: Vec<(Vec<u32>, Vec<u32>, Vec<i32>, Vec<u32>)> = vec![Default::default(); 8];
        let (mut acts, mut outs) = (vec![], vec![]);
        for variant in [0usize, 5, 6, 7] {
            d.htod(x, x0).map_err(e)?;
            match variant {
                0 => c.seven(i, false)?,
                7 => c.seven(i, true)?,
                5 => c.block_r("moe_decode_fused", i, 0, rlog_mk)?,
                _ => c.block_r(tc_name, i, 0, rlog_mk)?,
            }
            d.sync().map_err(e)?;
            if variant == 0 || variant == 6 {
                let mut ab = vec![0u8; 4 * kk * im];
                d.dtoh(&mut ab, act).map_err(e)?;
                acts.push(ab);
                outs.push(dtoh_f32(d, out, kk * h)?);
            }
            got[variant] = (
                bits(dtoh_f32(d, x, h)?),
                bits(dtoh_f32(d, hn2, h)?),
                ints(ids, kk)?,
                bits(dtoh_f32(d, wts, kk)?),
            );
        }
        let a = &got[0];
        // The multi-row tensor-core launches give moe_decode_fused_tc's bits.
        if got[7] != got[6] {
            differ.push(format!("moe_*_fp4_tc launches vs {tc_name}, router {i}"));
        }
        {
            let t = &got[6];
            if a.2 != t.2 || a.3 != t.3 {
                differ.push(format!("moe_decode_fused_tc, router {i}: routing"));
            }
            let f = |u: &u32| f32::from_bits(*u) as f64;
            let (mut err, mut mag, mut nerr, mut nmag) = (0f64, 0f64, 0f64, 0f64);
            for n in 0..h {
                let x0n = f32::from_le_bytes(x0[4 * n..4 * n + 4].try_into().unwrap()) as f64;
                err = err.max((f(&a.0[n]) - f(&t.0[n])).abs());
                mag = mag.max((f(&a.0[n]) - x0n).abs());
                nerr = nerr.max((f(&a.1[n]) - f(&t.1[n])).abs());
                nmag = nmag.max(f(&a.1[n]).abs());
            }
            tc_upd = tc_upd.max(err / mag.max(1e-30));
            // The gate/up outputs (the seven launches' f32 rows; moe_tc's as the down's B
            // fragments, hi + lo halves of x / 16 at tcd_put's places) and the per-slot down rows.
            let (mut ae, mut am, mut oe, mut om) = (0f64, 0f64, 0f64, 0f64);
            for g in 0..kk {
                for k in 0..im {
                    let q = 4 * (g * im + k);
                    let r = f32::from_le_bytes(acts[0][q..q + 4].try_into().unwrap()) as f64;
                    let pos = ((k >> 1) & 1) | ((k & 1) << 1);
                    let b = g * 1024
                        + ((((k >> 2) & 15) * 16 + (k >> 8) * 4 + ((k >> 6) & 3)) << 2)
                        + pos;
                    let hf = |u: usize| {
                        half::f16::from_le_bytes([acts[1][2 * u], acts[1][2 * u + 1]]).to_f64()
                    };
                    let v = (hf(b) + hf(b + 32)) * 16.0;
                    ae = ae.max((r - v).abs());
                    am = am.max(r.abs());
                }
                for n in 0..h {
                    let (r, v) = (outs[0][g * h + n] as f64, outs[1][g * h + n] as f64);
                    oe = oe.max((r - v).abs());
                    om = om.max(r.abs());
                }
            }
            tc_act = tc_act.max(ae / am.max(1e-30));
            tc_out = tc_out.max(oe / om.max(1e-30));
            tc_norm = tc_norm.max(nerr / nmag.max(1e-30));
        }
        for (v, b) in [("moe_decode_fused", &got[5])] {
            for (name, same) in [
                ("residual", a.0 == b.0),
                ("next normed row", a.1 == b.1),
                ("expert ids", a.2 == b.2),
                ("routing weights", a.3 == b.3),
            ] {
                if !same {
                    differ.push(format!("{v}, router {i}: {name}"));
                }
            }
        }
    }
    // The polling forms leave their logits unset for the next launch.
    if dtoh_f32(d, rlog_mk, e_n)?
        .iter()
        .any(|v| v.to_bits() != 0xFFFF_FFFF)
    {
        differ.push("moe_decode_fused: logits not unset after the launch".into());
    }
    if differ.is_empty() {
        println!("moe_decode_fused = the seven launches, XS-2.1 shape, 4 routers: bit-identical (residual, next normed row, ids, weights)");
    } else {
        println!(
            "moe_decode_fused / _1g vs the seven launches DIFFER: {}",
            differ.join(", ")
        );
    }
    println!(
        "moe_decode_fused_tc (moe_tc, tensor-core expert dots) vs the seven launches, 4 routers: routing {}, = the moe_*_fp4_tc launches bit for bit: {}; largest difference {tc_upd:.2e} of the largest layer update, next normed row {tc_norm:.2e} of its largest value, gate/up outputs {tc_act:.2e}, per-slot down rows {tc_out:.2e} (of the largest)",
        if differ.iter().any(|d| d.starts_with("moe_decode_fused_tc")) { "DIFFERS" } else { "the same bits" },
        if differ.iter().any(|d| d.starts_with("moe_*_fp4_tc")) { "NO" } else { "yes" }
    );
    Ok(())
}

/// The timing rows of [`moe_layer`]: the seven launches and each fused form.
fn moe_timings(c: &MoeCase, x0: &[u8], rows: &mut Vec<(String, f64, f64)>) -> Result<()> {
    let MoeCase {
        d,
        h,
        im,
        kk,
        reps,
        rw_bytes,
        x,
        rlog_mk,
        ..
    } = *c;
    d.htod(x, x0).map_err(e)?;
    // Bytes a layer reads: router + 9 experts' gate, up, down (codes + scales).
    let bytes = (rw_bytes + kk * 3 * im * h * 9 / 16) as f64;
    let t7 = time_graph(d, reps, &|i| c.seven(i, false))?;
    rows.push((
        "moe layer, 1 row: seven launches".into(),
        t7,
        bytes / t7 / 1e6,
    ));
    for name in ["moe_decode_fused", "moe_decode_fused_tc"] {
        let t = time_graph(d, reps, &|i| c.block_r(name, i, 0, rlog_mk))?;
        rows.push((format!("moe layer, 1 row: {name}"), t, bytes / t / 1e6));
    }
    Ok(())
}

/// `vname`'s phases: one graph of `reps` launches, launch i stamping tp[16 i ..], printed as
/// the mean time of each phase and the gap between launches.
fn moe_phases(c: &MoeCase, vname: &'static str) -> Result<()> {
    let MoeCase {
        d,
        reps,
        tp,
        rlog_mk,
        ..
    } = *c;
    // Phase stamps: one graph of reps launches, launch i stamping tp[16 i ..]; run once to warm
    // up, then once more from fresh stamps.
    let mut init = vec![0u8; 8 * 16 * reps];
    for i in 0..reps {
        init[128 * i..128 * i + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    }
    d.begin_capture().map_err(e)?;
    for i in 0..reps {
        let t = tp + (128 * i) as u64;
        c.block_r(vname, i, t, rlog_mk)?;
    }
    let g = d.end_capture().map_err(e)?;
    g.launch().map_err(e)?;
    d.sync().map_err(e)?;
    d.htod(tp, &init).map_err(e)?;
    let a = d.event().map_err(e)?;
    g.launch().map_err(e)?;
    let b = d.event().map_err(e)?;
    b.sync().map_err(e)?;
    let tt = a.ms_to(&b) * 1e3 / reps as f64;
    let mut raw = vec![0u8; 8 * 16 * reps];
    d.dtoh(&mut raw, tp).map_err(e)?;
    let t: Vec<u64> = raw
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // Stamps in time order (moe/decode_fused.cu): start, barrier 1 in / out, top-k done, barriers 2..4 in /
    // out, end (moe_decode_fused: "barrier 3" in / out both at the last block's down items done, no
    // grid barrier there).
    let order = [0usize, 1, 2, 10, 3, 4, 5, 6, 7, 8, 9];
    let names = [
        "norm + router GEMV",
        "barrier 1",
        "top-k",
        "gate/up",
        "barrier 2",
        "down",
        "barrier 3",
        "combine",
        "barrier 4",
        "next norm",
    ];
    let mut sum = [0f64; 10];
    let mut gap = 0f64;
    for i in 0..reps {
        let s = &t[16 * i..16 * i + 16];
        for j in 0..10 {
            sum[j] += s[order[j + 1]].saturating_sub(s[order[j]]) as f64 / 1e3;
        }
        if i > 0 {
            gap += s[0].saturating_sub(t[16 * (i - 1) + 9]) as f64 / 1e3;
        }
    }
    println!("{vname} phases (us, mean of {reps} launches in a graph at {tt:.2} us a launch; globaltimer):");
    for (j, n) in names.iter().enumerate() {
        println!("  {n}: {:.2}", sum[j] / reps as f64);
    }
    println!(
        "  launch gap (last block end -> next launch's first start): {:.2}",
        gap / (reps - 1) as f64
    );
    Ok(())
}
