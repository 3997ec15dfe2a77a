//! Feature rows for cost models: what the template says about a config (tile sizes, occupancy,
//! shared memory, intensity, waves, its analytic time) plus what describes the workload (shape,
//! types, layout), so one model can learn across workloads (transfer).

use tensortune_kernels::workload::Workload;
use tensortune_kernels::{Config, Target, Template};

use crate::Error;

/// Names of the workload columns appended to the template's own features.
pub const WORKLOAD_FEATURES: [&str; 7] =
    ["log2_m", "log2_n", "log2_k", "input_bytes", "accumulator_bytes", "a_k_contiguous", "b_k_contiguous"];

/// The shape/type/layout columns of a workload (implicit-GEMM view for conv2d).
pub fn workload_row(w: &Workload) -> [f64; 7] {
    let (m, n, k, a_k, b_k) = match w {
        Workload::Matmul(m) => (m.m, m.n, m.k, m.layout.a_k_contiguous(), m.layout.b_k_contiguous()),
        Workload::Conv2d(c) => {
            let (m, n, k) = c.gemm_dims();
            (m, n, k, true, true)
        }
    };
    let t = w.types();
    [
        (m as f64).log2(),
        (n as f64).log2(),
        (k as f64).log2(),
        // Bits, so packed types get their fraction of a byte (the same values as bytes for the rest).
        t.input.bits() as f64 / 8.0,
        t.accumulator.bits() as f64 / 8.0,
        a_k as u8 as f64,
        b_k as u8 as f64,
    ]
}

/// A full feature row and the template's analytic estimate of the kernel's time (the cold-start
/// prior of model-guided search).
pub fn row(template: &dyn Template, w: &Workload, config: &Config, target: &Target) -> Result<(Vec<f64>, f64), Error> {
    let own = template.features(w, config, target)?;
    let extra = wgmma_work(template, w, config, target, &own);
    let mut out: Vec<f64> = own.into_iter().map(|(_, v)| v).collect();
    out.extend(extra.into_iter().flatten());
    out.extend(workload_row(w));
    let analytic = template.model_us(w, config, target).unwrap_or(f64::INFINITY);
    Ok((out, analytic))
}

/// Names of the columns [`row`] adds after `wgmma_gemm`'s and `wgmma_conv2d`'s own.
pub const WGMMA_WORK_FEATURES: [&str; 5] =
    ["tile_waves", "last_wave_idle", "log2_k_iters", "epilogue_share", "fill_share"];

/// How a Hopper config divides the work, which the template's own columns leave the trees to
/// piece together: `tile_waves`, the units of work (output tiles, times the blocks of a K split)
/// over the blocks that run at once (a persistent grid's `waves` is 1 however many tiles each
/// block walks); `last_wave_idle`, the share of the SMs' time the last wave of units leaves idle
/// (none with stream-K, which shares the last wave's K out); `log2_k_iters`, the K tiles one
/// unit runs; `epilogue_share`, the output bytes of a tile over all the bytes it moves (its
/// operands' K tiles and its output), where the epilogue's form (`tma` or `direct`) pays;
/// `fill_share`, the pipeline's stages over the K tiles a block runs in all (a persistent block
/// fills its pipeline once for all its tiles, another once per tile): where K is short, a
/// persistent grid of about two tiles a block beats one of bigger tiles, one a block. Added on the
/// training split of the union-v14 replay, where such winners ranked 16th-45th under the prior
/// (m2048n2048k1024: 128x128 persistent against 256x128 in clusters of 2), 20 seeds: worst trials
/// to 2% 38 -> 23 (m1536n4608k1536 38 -> 12, m16n4096k4096 33 -> 18, m2048n2048k1024 8 -> 1),
/// least gain 5.0x -> 7.5x, median gain 43.3x -> 46.6x, median trials to 2% 3 -> 6 (the cost:
/// m1992n1000k1536 3 -> 7, m256n1024k8192 3 -> 7).
///
/// `wgmma_conv2d` gets them on its implicit GEMM (M the output channels, N the output pixels, K
/// the taps' channels: `ConvGemm::of`), whose plan it runs. Its best tile is the one that divides
/// that GEMM into waves well, and that differs between layers whose tile sizes are alike: without
/// these columns a layer's prior carried its neighbours' tiles by name (union-v19's n2h28w28c384,
/// 384 channels, drew 68% of its prior's weight from n8h20w20c160 k320, whose best is 160 rows,
/// two tiles of 320: its prior's first pick was a 160-row tile at 1.44x, three tiles with a fifth
/// padding, and its best, 96 rows, four tiles, 100 of them on 132 SMs, ranked 527th; n4h64w64c128
/// took n6h56w56c64's 128x64, 64 tiles on 132 SMs, 1.04x, over 64x64's 128). With them, 265th and
/// 13th. First tried on union-v14's training split without the prior's offset (`tuner`'s
/// `PriorOffset`), where they took the strided n12h28w28c256 from 13 to 40 trials to 5%; with it
/// 13 -> 2 (docs/BENCHMARKS.md, "Search"). `None` for other templates, and for a config that is
/// not one of the template's.
fn wgmma_work(
    template: &dyn Template,
    w: &Workload,
    config: &Config,
    target: &Target,
    own: &[(&'static str, f64)],
) -> Option<[f64; 5]> {
    let gemm = match (template.name(), w) {
        ("wgmma_gemm", Workload::Matmul(m)) => *m,
        ("wgmma_conv2d", Workload::Conv2d(c)) => tensortune_kernels::wgmma::ConvGemm::of(c).1,
        _ => return None,
    };
    let p = tensortune_kernels::wgmma::Plan::new(&gemm, config).ok()?;
    let per_sm = own.iter().find(|(n, _)| *n == "blocks_per_sm").map_or(1.0, |(_, v)| *v).max(1.0);
    let (p_extent, q_extent) = if p.swap { (gemm.m, gemm.n) } else { (gemm.n, gemm.m) };
    let cluster = u64::from(p.cluster.max(1));
    let tiles = p_extent.div_ceil(u64::from(p.bp)).next_multiple_of(cluster)
        * q_extent.div_ceil(u64::from(p.bq))
        * gemm.batch.max(1);
    let split = u64::from(p.k_split(target).max(1));
    let waves = (tiles * split) as f64 / (f64::from(target.sm_count) * per_sm);
    let idle = if p.stream_k { 0.0 } else { 1.0 - waves / waves.ceil().max(1.0) };
    let bk = 128 / u64::from(gemm.types.input.bytes().max(1));
    let k_iters = gemm.k.div_ceil(bk).div_ceil(split).max(1);
    let out_bytes = f64::from(p.bp * p.bq) * f64::from(gemm.types.output.bytes());
    let in_bytes = f64::from(p.bp + p.bq) * (k_iters * bk) as f64 * f64::from(gemm.types.input.bytes());
    // The pipeline's fill (its stages of K tiles) over the K tiles a block runs: a persistent
    // block fills it once for all its tiles, another block once per tile.
    let per_block = if p.persistent { waves.max(1.0) } else { 1.0 };
    let fill = f64::from(p.stages) / (k_iters as f64 * per_block);
    Some([waves, idle, (k_iters as f64).log2(), out_bytes / (out_bytes + in_bytes), fill])
}

/// The columns of a space that holds the configs of several templates (a job that searches every
/// template of its op): a one-hot of the template, then each template's own features in columns of
/// its own, then the workload's columns (last, as in every row, where transfer reads them). A
/// template's columns are missing (NaN, which the trees send down a learned "missing" branch) in
/// the rows of the other templates' configs. With one template the layout is the template's row
/// itself, unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnionLayout {
    /// Feature columns of each template (without the workload's), in slot order.
    widths: Vec<usize>,
}

impl UnionLayout {
    /// The layout of templates whose own rows have `widths` feature columns (workload columns
    /// excluded), in slot order.
    pub fn new(widths: Vec<usize>) -> UnionLayout {
        UnionLayout { widths }
    }

    /// Columns of a row in this layout.
    pub fn width(&self) -> usize {
        if self.widths.len() == 1 {
            return self.widths[0] + WORKLOAD_FEATURES.len();
        }
        self.widths.len() + self.widths.iter().sum::<usize>() + WORKLOAD_FEATURES.len()
    }

    /// The row of a config of the template at `slot` (a position in the layout), from that
    /// template's full row ([`row`]: its features, then the workload's). `None` when the row does
    /// not have the template's width or `slot` is not in the layout.
    pub fn embed(&self, slot: usize, row: &[f64]) -> Option<Vec<f64>> {
        let own = *self.widths.get(slot)?;
        if row.len() != own + WORKLOAD_FEATURES.len() {
            return None;
        }
        if self.widths.len() == 1 {
            return Some(row.to_vec());
        }
        let mut out = Vec::with_capacity(self.width());
        out.extend((0..self.widths.len()).map(|s| if s == slot { 1.0 } else { 0.0 }));
        for (s, width) in self.widths.iter().enumerate() {
            if s == slot {
                out.extend_from_slice(&row[..own]);
            } else {
                out.extend(std::iter::repeat_n(f64::NAN, *width));
            }
        }
        out.extend_from_slice(&row[own..]);
        Some(out)
    }
}

/// The target a device class was measured on, for features: the class's compute capability with
/// the limits of that generation's data-center part, and the class's own SM count where its key
/// names one (`name/sm90/114sm`: an H100 PCIe's waves are not an H200's); `sim` for the simulator.
pub fn target_for_class(class_key: &str) -> Target {
    if class_key == "sim" {
        return Target::sim();
    }
    let mut t = if class_key.contains("/sm80/") || class_key.contains("/sm86/") || class_key.contains("/sm89/") {
        Target::sm80()
    } else {
        Target::sm90()
    };
    if let Some(sms) = class_key.rsplit('/').next().and_then(|p| p.strip_suffix("sm")).and_then(|n| n.parse().ok()) {
        t.sm_count = sms;
    }
    t.class_key = class_key.to_owned();
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_kernels::template::valid_configs;
    use tensortune_kernels::{DType, Layout, Matmul, Types, gemm};

    #[test]
    fn rows_have_a_fixed_width_and_finite_values() {
        let w =
            Workload::Matmul(Matmul::new(512, 64, 512, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap());
        let t = Target::sm90();
        let configs = valid_configs(&gemm::WmmaGemm, &w, &t).unwrap();
        let width = row(&gemm::WmmaGemm, &w, &configs[0].1, &t).unwrap().0.len();
        for (_, c) in configs.iter().step_by(97) {
            let (r, analytic) = row(&gemm::WmmaGemm, &w, c, &t).unwrap();
            assert_eq!(r.len(), width);
            assert!(r.iter().all(|v| v.is_finite()) && analytic.is_finite() && analytic > 0.0);
        }
        assert_eq!(target_for_class("nvidia-a100-sxm4-80gb/sm80/108sm").arch, 80);
        assert_eq!(target_for_class("nvidia-h200/sm90/132sm").arch, 90);
        assert_eq!(target_for_class("sim").class_key, "sim");
        assert_eq!(target_for_class("nvidia-h100-pcie/sm90/114sm").sm_count, 114);
        assert_eq!(target_for_class("nvidia-h200/sm90/132sm").sm_count, 132);
        assert_eq!(target_for_class("odd/sm90/many").sm_count, Target::sm90().sm_count);
    }

    #[test]
    fn hopper_rows_say_how_the_work_divides() {
        use tensortune_kernels::wgmma::WgmmaGemm;
        // 2048 x 11008: 8 x 86 tiles of 256 x 128, 5.2 waves on 132 SMs of one block each.
        let w = Workload::from_key("matmul/m2048n11008k4096/tn/f16,f32,f16/alpha=1,beta=0").unwrap();
        let t = Target::sm90();
        let config = |stream_k: u8, persistent: u8| {
            Config::from_json(&format!(
                r#"{{"block_m":256,"block_n":128,"cluster":1,"consumers":2,"epilogue":"direct","persistent":{persistent},"producer":"warpgroup","raster":"m","raster_group":1,"schedule":"cooperative","stages":3,"stream_k":{stream_k}}}"#
            ))
            .unwrap()
        };
        let own = WgmmaGemm.features(&w, &config(0, 1), &t).unwrap().len();
        let extra = |c: &Config| row(&WgmmaGemm, &w, c, &t).unwrap().0[own..own + WGMMA_WORK_FEATURES.len()].to_vec();
        let plain = extra(&config(0, 1));
        let waves = 8.0 * 86.0 / 132.0;
        assert!((plain[0] - waves).abs() < 1e-9, "{plain:?}");
        assert!((plain[1] - (1.0 - waves / 6.0)).abs() < 1e-9, "{plain:?}");
        assert_eq!(plain[2], 64f64.log2(), "4096 / 64 K tiles of f16");
        let (out, ins) = (256.0 * 128.0 * 2.0, 384.0 * 4096.0 * 2.0);
        assert!((plain[3] - out / (out + ins)).abs() < 1e-12);
        assert_eq!(extra(&config(1, 1))[1], 0.0, "stream-K leaves no last wave idle");
        assert_eq!(extra(&config(0, 0))[0], plain[0], "a persistent grid's tiles make as many waves");
        // 3 stages of 64 K tiles: filled once per tile, or once per 5.2 tiles in a persistent block.
        assert!((plain[4] - 3.0 / (64.0 * waves)).abs() < 1e-12, "{plain:?}");
        assert_eq!(extra(&config(0, 0))[4], 3.0 / 64.0);
        // A Hopper conv layer's columns are those of its implicit GEMM: 128 output channels by
        // 4 x 32 x 32 pixels, 64x64 tiles (two by 64) over 132 SMs.
        use tensortune_kernels::wgmma::conv::WgmmaConv2d;
        let layer =
            Workload::from_key("conv2d/n4h64w64c128/k128r3s3/pad1x1,stride2x2,dil1x1/nhwc/f16,f32,f16").unwrap();
        let tile = Config::from_json(
            r#"{"block_m":64,"block_n":64,"cluster":1,"consumers":2,"epilogue":"tma","persistent":0,"producer":"warpgroup","raster":"m","raster_group":1,"schedule":"pingpong","stages":4,"stream_k":0}"#,
        )
        .unwrap();
        let own = WgmmaConv2d.features(&layer, &tile, &t).unwrap().len();
        let conv = row(&WgmmaConv2d, &layer, &tile, &t).unwrap().0;
        assert_eq!(conv.len(), own + WGMMA_WORK_FEATURES.len() + WORKLOAD_FEATURES.len());
        assert!((conv[own] - 128.0 / 132.0).abs() < 1e-9, "{:?}", &conv[own..]);
        assert_eq!(conv[own + 2], 18f64.log2(), "1152 / 64 K tiles of f16");
        // Other templates' rows are their own features and the workload's.
        let m = Workload::from_key("matmul/m512n64k512/nn/f16,f32,f32/alpha=1,beta=0").unwrap();
        let c = valid_configs(&gemm::WmmaGemm, &m, &t).unwrap()[0].1.clone();
        let n = gemm::WmmaGemm.features(&m, &c, &t).unwrap().len();
        assert_eq!(row(&gemm::WmmaGemm, &m, &c, &t).unwrap().0.len(), n + WORKLOAD_FEATURES.len());
    }

    #[test]
    fn union_rows_put_each_template_in_its_own_columns() {
        let single = UnionLayout::new(vec![2]);
        let row = [1.0, 2.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0];
        assert_eq!(single.embed(0, &row).unwrap(), row, "one template: its row unchanged");
        assert_eq!(single.width(), 9);
        let union = UnionLayout::new(vec![2, 3]);
        assert_eq!(union.width(), 2 + 2 + 3 + 7);
        let first = union.embed(0, &row).unwrap();
        assert_eq!(&first[..4], &[1.0, 0.0, 1.0, 2.0]);
        assert!(first[4..7].iter().all(|v| v.is_nan()));
        assert_eq!(&first[7..], &row[2..]);
        let second = union.embed(1, &[5.0, 6.0, 7.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]).unwrap();
        assert_eq!(&second[..2], &[0.0, 1.0]);
        assert!(second[2..4].iter().all(|v| v.is_nan()));
        assert_eq!(&second[4..7], &[5.0, 6.0, 7.0]);
        assert_eq!(second.len(), union.width());
        assert_eq!(union.embed(1, &row), None, "a row of the wrong width");
        assert_eq!(union.embed(2, &row), None, "a slot outside the layout");
    }
}
