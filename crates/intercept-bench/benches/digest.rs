//! BLAKE2b-128 digests of request bodies (1 KiB and 1 MiB): what a content digest of
//! every recorded request would cost on the hot path.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]
// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use blake2::digest::consts::U16;
use blake2::{Blake2b, Digest};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

type Blake2b128 = Blake2b<U16>;

fn digest(c: &mut Criterion) {
    let mut group = c.benchmark_group("blake2b128");
    for (name, size) in [("1KiB", 1usize << 10), ("1MiB", 1 << 20)] {
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), &body, |b, body| {
            b.iter(|| Blake2b128::digest(std::hint::black_box(body)))
        });
    }
    group.finish();
}

criterion_group!(benches, digest);
criterion_main!(benches);
