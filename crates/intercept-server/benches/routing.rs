//! Routing a call to its session: the registry keeps sessions in a `DashMap` keyed by
//! [`Secret`] (constant-time equality, 22-character url-safe base64) and looks them up
//! with a [`SecretStr`] borrowed from the header (no allocation). This measures one
//! lookup among 100,000 registered sessions against the former `Secret::new` lookup (an
//! allocation per request), a `DashMap<String, _>` looked up by `&str` (same map, but
//! `str`'s early-exit equality) and a plain `HashMap<String, _>` baseline.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::collections::HashMap;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use dashmap::DashMap;
use intercept_core::{Secret, SecretStr};

const SESSIONS: usize = 100_000;

fn lookup(c: &mut Criterion) {
    let secrets: Vec<Secret> = (0..SESSIONS).map(|_| Secret::generate()).collect();
    let texts: Vec<String> = secrets.iter().map(|s| s.expose().to_owned()).collect();
    let by_secret: DashMap<Secret, Arc<usize>> = DashMap::new();
    let by_string: DashMap<String, Arc<usize>> = DashMap::new();
    let mut plain: HashMap<String, Arc<usize>> = HashMap::new();
    for (i, s) in secrets.iter().enumerate() {
        by_secret.insert(s.clone(), Arc::new(i));
        by_string.insert(texts[i].clone(), Arc::new(i));
        plain.insert(texts[i].clone(), Arc::new(i));
    }
    let mut group = c.benchmark_group("secret_lookup_100k");
    let mut i = 0usize;
    let mut next = || {
        i = (i + 7919) % SESSIONS;
        &texts[i]
    };
    group.bench_function("dashmap_secret_str_from_header", |b| {
        b.iter(|| {
            by_secret
                .get(SecretStr::new(next().as_str()))
                .map(|e| e.value().clone())
        })
    });
    group.bench_function("dashmap_secret_new_from_header", |b| {
        b.iter(|| {
            let key = Secret::new(next().as_str());
            by_secret.get(&key).map(|e| e.value().clone())
        })
    });
    group.bench_function("dashmap_string_by_str", |b| {
        b.iter(|| by_string.get(next().as_str()).map(|e| e.value().clone()))
    });
    group.bench_function("hashmap_string_baseline", |b| {
        b.iter(|| plain.get(next().as_str()).cloned())
    });
    group.bench_function("miss_dashmap_secret", |b| {
        let key = Secret::generate();
        b.iter(|| by_secret.get(key.as_ref() as &SecretStr).is_some())
    });
    group.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
