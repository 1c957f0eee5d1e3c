//! The CUDA backend behind the benches' and device checks' seam (`model::device`): what the
//! model loaded and how, graph replay, per-kernel profiles, the device sampler on given logits,
//! and its DFlash draft.
use super::draft::CudaDraft;
use super::{cerr, device, CudaModel};
use crate::error::Result;
use crate::model::device::{DeviceDraft, DeviceInfo, DeviceModel, KernelTime};
use crate::model::SeqId;
use crate::sample::SamplingParams;
use std::path::Path;

impl CudaModel {
    /// Sliding-window rings: (slots per sequence, sequences, bytes); slots 0 when none.
    fn kv_rings(&self) -> (usize, usize, usize) {
        let kvw = self.cfg.num_kv_heads * self.cfg.head_dim;
        let n = self.w.layers.iter().filter(|l| l.ring).count();
        let seqs = if self.kv.ring > 0 {
            self.opts.max_seqs.max(1)
        } else {
            0
        };
        (
            self.kv.ring,
            seqs,
            n * seqs * self.kv.ring * kvw * 2 * self.kv.elt,
        )
    }
    /// Positions one sequence can hold (the paged pool's, or the model's limit with no full layer).
    fn kv_capacity(&self) -> usize {
        if self.kv.full_layers == 0 {
            self.cfg.max_position_embeddings
        } else {
            self.kv.max_pages * self.kv.page_size
        }
    }
}

impl DeviceModel for CudaModel {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.dev.name.clone(),
            arch: self.dev.arch.clone(),
            weight_bytes: self.weight_bytes,
            decode_weight_bytes: self.decode_weight_bytes,
            load_secs: self.load_secs,
            kv_fp8: self.kv_fp8(),
            kv_capacity: self.kv_capacity(),
            kv_pool: self.kv_pool(),
            kv_rings: self.kv_rings(),
            ring_spare: self.ring_spare(),
            moe_stagger: (self.shape.mk_stag, self.dev.mem_bw),
        }
    }
    fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        self.dev.copy_bandwidth(bytes).map_err(cerr)
    }
    fn decode_greedy(&mut self, seq: SeqId, token: u32) -> Result<u32> {
        let mut prof = self.fwd.prof.take();
        let r = self.decode_greedy_step(seq, token, &mut prof);
        self.fwd.prof = prof;
        r
    }
    fn replay_decode_graph(&self, n: usize) -> Result<Option<f64>> {
        CudaModel::replay_decode_graph(self, n)
    }
    fn decode_timeline(&self) -> Result<Option<String>> {
        CudaModel::decode_timeline(self)
    }
    fn set_profiling(&mut self, on: bool) {
        self.fwd.prof = if on {
            Some(device::Prof::default())
        } else {
            None
        };
    }
    fn take_profile(&mut self) -> Vec<KernelTime> {
        self.fwd
            .prof
            .as_mut()
            .map(|p| p.summary())
            .unwrap_or_default()
    }
    fn sample_logits(&self, rows: &[&[f32]], items: &[(SamplingParams, f64)]) -> Result<Vec<u32>> {
        CudaModel::sample_logits(self, rows, items)
    }
    fn set_taps_on_device(&mut self, on: bool) -> Result<()> {
        CudaModel::set_taps_on_device(self, on)
    }
    fn load_draft(&self, dir: &Path) -> Result<Box<dyn DeviceDraft>> {
        Ok(Box::new(CudaDraft::load(dir, self)?))
    }
}
