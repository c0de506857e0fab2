//! The thread count, `set_threads` and `threads`: which threads an op runs on, and that its results
//! do not depend on how many. A binary of its own: the count is the process's, and the other tests
//! running beside these (their ops share the threads) would change how many an op here gets.

use std::collections::HashSet;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use tensorscope::ops::AttentionOptions;
use tensorscope::{set_threads, threads, Param, Pool, TensorOps};

/// The threads that ran `map` over a tensor of 2^18 elements (four parts' worth), its kernel
/// waiting, for up to `patience`, until `wanted` threads have each run some of it: with that many
/// threads each takes a part, and with fewer the wait times out and the rest runs as it comes.
fn threads_running_a_map(pool: &Pool, wanted: usize, patience: Duration) -> HashSet<ThreadId> {
    let seen = Mutex::new(HashSet::new());
    let deadline = Instant::now() + patience;
    pool.scope(|s| {
        let y = s.ones::<f32>(&[1 << 18]).map(|x| {
            let mut seen_now = seen.lock().unwrap();
            seen_now.insert(std::thread::current().id());
            while seen_now.len() < wanted && Instant::now() < deadline {
                drop(seen_now);
                std::thread::sleep(Duration::from_millis(1));
                seen_now = seen.lock().unwrap();
            }
            x + 1.0
        });
        assert!(y.to_vec().iter().all(|&v| v == 2.0));
    });
    seen.into_inner().unwrap()
}

/// How long a map waits for threads that should come: a test that fails rather than hangs.
const LONG: Duration = Duration::from_secs(20);

/// How long a map waits for a thread that should not come: ample time for a worker to take a
/// part, if one were posted.
const SHORT: Duration = Duration::from_millis(300);

/// The bits of ops that split over the threads: a product on the packed path and one on the
/// path of a decode step, elementwise and lane ops, the fused attention, a convolution (its
/// images split over the threads; its input's gradient is another convolution's forward, or with
/// stride 2 scattered back image by image; its weight's gradient split by channels), and a
/// training step's gradients through all of them.
fn results(pool: &Pool, w: &Param, head: &Param) -> Vec<Vec<u32>> {
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    pool.train(|s| {
        let x = s.randn::<f32>(&[64, 256], 1);
        let h = x.matmul(w).gelu(); // [64, 256] x [256, 256]
        let logits = h.narrow(0, 0, 1).matmul(&s.bind(head).t()); // [1, 256] x [256, 4096]^T
        let probs = (&h).softmax(-1).layer_norm(1e-5);
        let q = s.randn::<f32>(&[2, 4, 128, 32], 2);
        let (k, v) = (&q * 0.5, &q + 1.0);
        let causal = AttentionOptions {
            causal: true,
            ..AttentionOptions::default()
        };
        let attended = q.scaled_dot_product_attention(&k, &v, causal);
        let images = s.randn::<f32>(&[4, 16, 32, 32], 3).requires_grad();
        let kernels = s.bind(w).reshape(&[16, 16, 16, 16]);
        let convolved = images.conv2d(&kernels, 1, 1);
        let strided = images.conv2d(&kernels, 2, 1);
        let loss = &(&logits.sum_all() + &probs.mean_all()) + &(&h).tanh().sum_all();
        let loss = &loss + &(&convolved * &convolved).mean_all();
        let loss = &loss + &(&strided * &strided).mean_all();
        let grads = loss.backward().unwrap();
        vec![
            bits(h.to_vec()),
            bits(logits.to_vec()),
            bits(probs.to_vec()),
            bits(attended.to_vec()),
            bits(convolved.to_vec()),
            bits(strided.to_vec()),
            bits(grads.of(&images).unwrap().to_vec()),
            bits(grads.get(w).unwrap().to_vec()),
            bits(grads.get(head).unwrap().to_vec()),
        ]
    })
}

#[test]
fn the_count_set_is_the_count_ops_run_on_and_results_do_not_change() {
    let by_default = threads();
    assert!((1..=64).contains(&by_default), "{by_default}");
    let pool = Pool::with_max_memory_mb(256);
    let (w, head) = pool.scope(|s| {
        let w = (s.randn::<f32>(&[256, 256], 3) * 0.06).detach();
        (w, (s.randn::<f32>(&[4096, 256], 4) * 0.06).detach())
    });

    set_threads(1);
    assert_eq!(threads(), 1);
    let alone = results(&pool, &w, &head);
    let here = std::thread::current().id();
    assert_eq!(
        threads_running_a_map(&pool, 2, SHORT),
        HashSet::from([here])
    );

    // More threads than this machine may have cores: the team grows to the count.
    for n in [3, 2] {
        set_threads(n);
        assert_eq!(threads(), n);
        let ran_on = threads_running_a_map(&pool, n, LONG);
        assert_eq!(ran_on.len(), n, "{n} threads");
        assert!(ran_on.contains(&here), "the caller takes a part");
        assert!(
            results(&pool, &w, &head) == alone,
            "{n} threads: the bits of one"
        );
    }

    // Back to one: the workers sleep and every op runs here again.
    set_threads(1);
    assert_eq!(
        threads_running_a_map(&pool, 2, SHORT),
        HashSet::from([here])
    );
    assert!(results(&pool, &w, &head) == alone);

    set_threads(1000);
    assert_eq!(threads(), 64, "the most threads an op can use");
    set_threads(by_default);
    assert_eq!(threads(), by_default);
}

#[test]
#[should_panic(expected = "set_threads(0): the count includes the calling thread")]
fn zero_threads_is_refused() {
    set_threads(0);
}
