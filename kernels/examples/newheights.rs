// Throwaway: a selftest list of configs with the new block_m heights, spread over kinds.
use tensortune_kernels::template::valid_configs;
use tensortune_kernels::*;
fn main() {
    let keys = [
        ("matmul/m776n2312k512/tt/bf16,f32,bf16/alpha=1,beta=0", "wgmma_gemm"),
        ("matmul/m1000n1000k1000/tn/f16,f32,f16/alpha=1,beta=-1", "wgmma_gemm"),
        ("matmul/m8192n8192k1024/tn/f16,f32,f32/alpha=1,beta=0", "wgmma_gemm"),
        ("matmul/m2048n2048k2048/tn/i8,i32,i32/alpha=1,beta=0", "wgmma_gemm"),
        ("matmul/m4096n4096k4096/tn/e4m3,f32,bf16/alpha=1,beta=0,scale=tensor,epi=bias", "wgmma_gemm"),
        ("matmul/m1000n1000k1000/tn/tf32,f32,f32/alpha=1,beta=0", "wgmma_gemm"),
        ("matmul/m1024n256k2048/tn/f16,f32,f16/alpha=1,beta=0", "wgmma_gemm"),
        ("conv2d/n64h7w7c2048/k512r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16", "wgmma_conv2d"),
        ("conv2d/n8h14w14c512/k512r3s3/pad1x1,stride1x1,dil1x1/nhwc/bf16,f32,bf16", "wgmma_conv2d"),
        ("conv2d/n32h28w28c128/k512r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16/beta=1,epi=bias+relu", "wgmma_conv2d"),
    ];
    let t = Target::sm90();
    for (i, (key, tn)) in keys.iter().enumerate() {
        let w = Workload::from_key(key).unwrap();
        let tmpl = registry::by_name(tn).unwrap();
        let v = valid_configs(tmpl, &w, &t).unwrap();
        let new: Vec<_> = v.iter().filter(|(_, c)| ![64, 128, 160, 192, 256].contains(&c.int("block_m").unwrap())).collect();
        let heights = [80, 96, 112, 144, 176, 208, 224, 240];
        let mut n = 0;
        for j in 0..4 {
            let h = heights[(i * 4 + j) % heights.len()];
            let of_h: Vec<_> = new.iter().filter(|(_, c)| c.int("block_m").unwrap() == h).collect();
            if of_h.is_empty() { continue; }
            let (_, c) = of_h[(i * 131 + j * 977) % of_h.len()];
            println!("{key}\t{tn}\t{}", c.to_json());
            n += 1;
        }
        eprintln!("{key}: {} valid, {} with a new height, {n} listed", v.len(), new.len());
    }
}
