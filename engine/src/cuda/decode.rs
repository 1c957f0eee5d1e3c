//! Decode steps from captured CUDA graphs (`decode_greedy`, `decode_step` with `sample_rows`)
//! and the device sampler's launch.
use super::*;

/// One row's parameters for `sample_rows`: (temperature, 0 = greedy; top_k; top_p; u).
fn sample_params(sp: &SamplingParams, u: f64) -> [f64; 4] {
    let t = if sp.is_greedy() {
        0.0
    } else {
        sp.temperature as f64
    };
    [t, sp.top_k as f64, sp.top_p as f64, u]
}

impl CudaModel {
    /// One greedy decode step for one sequence entirely on the device: returns the argmax token.
    /// Replays a CUDA graph of the whole step when graphs are on (the step's only host syncs are
    /// the metadata upload and reading the sampled token).
    pub fn decode_greedy(
        &mut self,
        seq: SeqId,
        token: u32,
        prof: &mut Option<device::Prof>,
    ) -> Result<u32> {
        let pos = self.seq_len(seq);
        self.check_ring(seq, pos)?;
        self.ensure_pages(seq, pos + 1)?;
        if token as usize >= self.cfg.vocab_size {
            return Err(EngineError::Request(format!(
                "token id {token} is outside the vocabulary"
            )));
        }
        self.upload_meta(&[token as i32], &[pos as i32], &[0], &[seq])?;
        self.dev
            .htod_cached(self.sc.sel, as_bytes(&[0i32]))
            .map_err(cerr)?;
        let use_graph =
            self.opts.graphs && prof.is_none() && self.taps.is_empty() && !self.graph_failed;
        if use_graph && self.graph.is_none() {
            match self.capture_decode() {
                Ok(g) => self.graph = Some(g),
                Err(e) => {
                    tracing::warn!("CUDA graph capture failed, running eagerly: {e}");
                    self.graph_failed = true;
                }
            }
        }
        if use_graph && self.graph.is_some() {
            self.graph.as_ref().unwrap().launch().map_err(cerr)?;
        } else {
            self.decode_body(prof)?;
        }
        let mut out = [0i32];
        self.dev
            .dtoh(as_bytes_mut(&mut out), self.sc.amax)
            .map_err(cerr)?;
        self.note_written(seq, pos + 1);
        self.seqs.get_mut(&seq).unwrap().len = pos + 1;
        Ok(out[0] as u32)
    }

    /// Diagnostic (`laguna bench`): the captured greedy decode graph replayed n times back to
    /// back with the last step's inputs (the same position, its K/V slot rewritten with the same
    /// values; nothing read back in between): ms a replay, None before a graph exists.
    pub fn replay_decode_graph(&self, n: usize) -> Result<Option<f64>> {
        let Some(g) = self.graph.as_ref() else {
            return Ok(None);
        };
        self.dev.sync().map_err(cerr)?;
        let a = self.dev.event().map_err(cerr)?;
        for _ in 0..n {
            g.launch().map_err(cerr)?;
        }
        let b = self.dev.event().map_err(cerr)?;
        b.sync().map_err(cerr)?;
        Ok(Some(a.ms_to(&b) / n.max(1) as f64))
    }

    /// `Model::decode_step` on the device: one pass of n rows (one per sequence), the final norm
    /// and lm_head over all of them, `sample_rows`; replayed from a CUDA graph per n when graphs
    /// are on. Host syncs: the metadata/parameter uploads and reading the n tokens.
    pub(super) fn decode_step_dev(&mut self, items: &[DecodeItem]) -> Result<Vec<u32>> {
        let n = items.len();
        if n == 0 {
            return Ok(vec![]);
        }
        if n > self.device_sampling() {
            return Err(EngineError::Other(format!(
                "decode_step takes at most {} sequences here, got {n}",
                self.device_sampling()
            )));
        }
        let v = self.cfg.vocab_size;
        let mut tokens = Vec::with_capacity(n);
        let mut pos = Vec::with_capacity(n);
        let mut seqs = Vec::with_capacity(n);
        let mut params = Vec::with_capacity(4 * n);
        for (i, it) in items.iter().enumerate() {
            if it.token as usize >= v {
                return Err(EngineError::Request(format!(
                    "token id {} is outside the vocabulary (size {v})",
                    it.token
                )));
            }
            if items[..i].iter().any(|o| o.seq == it.seq) {
                return Err(EngineError::Other(format!(
                    "sequence {} appears twice in one decode step",
                    it.seq
                )));
            }
            if !self.seqs.contains_key(&it.seq) {
                return Err(EngineError::Other(format!("unknown sequence {}", it.seq)));
            }
            let p = self.seq_len(it.seq);
            self.check_ring(it.seq, p)?;
            self.ensure_pages(it.seq, p + 1)?;
            tokens.push(it.token as i32);
            pos.push(p as i32);
            seqs.push(it.seq);
            params.extend_from_slice(&sample_params(it.params, it.u));
        }
        let seqrow: Vec<i32> = (0..n as i32).collect();
        self.upload_meta(&tokens, &pos, &seqrow, &seqs)?;
        self.dev
            .htod_cached(self.sc.sel, as_bytes(&seqrow))
            .map_err(cerr)?;
        self.dev
            .htod_staged(self.sc.sparams, as_bytes(&params))
            .map_err(cerr)?;
        // Every row greedy (KernelSet serve_argmax): the tokens by `argmax_rows_p` instead of
        // `sample_rows` (whose greedy rows take the same index, the lowest among the maxima, in
        // one block a row). One graph per (n, greedy).
        let greedy = self.kset.serve_argmax
            && self.kset.argmax_p
            && n <= self.sc.lrows
            && items.iter().all(|it| it.params.is_greedy());
        let key = (n, greedy);
        let use_graph = self.opts.graphs && self.taps.is_empty() && !self.graph_failed;
        if use_graph && !self.step_graphs.contains_key(&key) {
            match self.capture(|m| m.decode_step_body(&mut None, n, greedy)) {
                Ok(g) => {
                    self.step_graphs.insert(key, g);
                }
                Err(e) => {
                    tracing::warn!("CUDA graph capture failed, running eagerly: {e}");
                    self.graph_failed = true;
                }
            }
        }
        match self.step_graphs.get(&key).filter(|_| use_graph) {
            Some(g) => g.launch().map_err(cerr)?,
            None => self.decode_step_body(&mut None, n, greedy)?,
        }
        let mut out = vec![0i32; n];
        self.dev
            .dtoh(as_bytes_mut(&mut out), self.sc.amax)
            .map_err(cerr)?;
        for (it, &p) in items.iter().zip(&pos) {
            self.note_written(it.seq, p as usize + 1);
            self.seqs.get_mut(&it.seq).unwrap().len = p as usize + 1;
        }
        Ok(out.into_iter().map(|t| t as u32).collect())
    }

    pub(super) fn decode_step_body(
        &self,
        prof: &mut Option<device::Prof>,
        n: usize,
        greedy: bool,
    ) -> Result<()> {
        self.run_layers(n, prof)?;
        if greedy {
            // The rows listed in sc.sel are 0..n (decode_step_dev), so greedy_rows' argmax of
            // logits row i is row i's token, in sc.amax as sample_rows leaves it.
            self.greedy_rows(prof, n, self.sc.amax)
        } else {
            self.sample_rows(prof, n)
        }
    }

    /// Final norm + lm_head over the rows listed in sc.sel (n of them), then one token per row
    /// drawn by `sample_rows` with the parameters in sc.sparams, into sc.amax.
    pub(super) fn sample_rows(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        self.final_logits(prof, n)?;
        self.launch_sample(prof, n)
    }

    /// `sample_rows` over the first n rows of sc.logits with the parameters in sc.sparams.
    pub(super) fn launch_sample(&self, prof: &mut Option<device::Prof>, n: usize) -> Result<()> {
        let sc = &self.sc;
        self.dev
            .launch_p(
                prof,
                "sample_rows",
                (n as u32, 1, 1),
                (1024, 1, 1),
                0,
                |b| {
                    b.u64(sc.logits)
                        .i32(self.cfg.vocab_size as i32)
                        .u64(sc.sparams)
                        .u64(sc.samp_e)
                        .u64(sc.amax);
                },
            )
            .map_err(cerr)
    }

    /// Draw one token from each of the given logits rows with `sample_rows` (device sampling
    /// checks: the rows are uploaded to the logits buffer).
    pub fn sample_logits(
        &self,
        rows: &[&[f32]],
        items: &[(SamplingParams, f64)],
    ) -> Result<Vec<u32>> {
        let n = rows.len();
        let v = self.cfg.vocab_size;
        if n > DECODE_ROWS || v > 1 << 17 || items.len() != n || rows.iter().any(|r| r.len() != v) {
            return Err(EngineError::Other(format!(
                "sample_logits: at most {DECODE_ROWS} rows of {v} logits, one parameter set each"
            )));
        }
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        self.dev
            .htod(self.sc.logits, as_bytes(&flat))
            .map_err(cerr)?;
        let params: Vec<f64> = items
            .iter()
            .flat_map(|(sp, u)| sample_params(sp, *u))
            .collect();
        self.dev
            .htod_staged(self.sc.sparams, as_bytes(&params))
            .map_err(cerr)?;
        self.launch_sample(&mut None, n)?;
        let mut out = vec![0i32; n];
        self.dev
            .dtoh(as_bytes_mut(&mut out), self.sc.amax)
            .map_err(cerr)?;
        Ok(out.into_iter().map(|t| t as u32).collect())
    }

    pub(super) fn decode_body(&self, prof: &mut Option<device::Prof>) -> Result<()> {
        self.run_layers(1, prof)?;
        self.greedy_rows(prof, 1, self.sc.amax)
    }

    pub(super) fn capture_decode(&self) -> std::result::Result<device::Graph, String> {
        self.capture(|m| m.decode_body(&mut None))
    }

    /// The launches of `body` captured as one CUDA graph.
    pub(super) fn capture(
        &self,
        body: impl FnOnce(&Self) -> Result<()>,
    ) -> std::result::Result<device::Graph, String> {
        self.dev.begin_capture()?;
        let r = body(self);
        let g = self.dev.end_capture();
        r.map_err(|e| e.to_string())?;
        g
    }
}
