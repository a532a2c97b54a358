//! Test tools for proving cni-guard on real containerd (Debian's 1.6 and a current 2.x) through
//! the CRI, driven by crictl: a private containerd in its own network namespace, CNI configs and
//! leak inspection. Root only.
pub mod cni;
pub mod containerd;
pub mod crictl;
pub mod netns;
pub mod prereq;
pub mod runtime;

use std::path::Path;

pub use containerd::Containerd;
pub use runtime::Generation;

/// Builds the sandbox image, starts a private containerd of `generation`, imports the image and
/// fills its CNI bin dir with that generation's reference plugins and `extra` binaries (name in
/// the bin dir, source path).
pub fn start_containerd(generation: Generation, extra: &[(&str, &Path)]) -> Containerd {
    let images = tempfile::tempdir().expect("temp dir");
    let tar = images.path().join("sandbox.tar");
    prereq::build_image("sandbox", &tar, &[containerd::SANDBOX_IMAGE]).expect("sandbox image");
    let ctrd = Containerd::start(generation, &tar)
        .unwrap_or_else(|e| panic!("start containerd {}: {e}", generation.label()));
    prereq::populate_bin_dir(&generation.plugins(), &ctrd.bin_dir(), extra).expect("CNI bin dir");
    println!(
        "runtime {} ({}), CNI plugins {}",
        ctrd.runtime_name(),
        generation.containerd().display(),
        generation.plugins().display()
    );
    ctrd
}

/// One `#[test]` per containerd generation for a suite function `fn(Generation)`:
/// `<suite>::containerd_1_6` and `<suite>::containerd_2`.
#[macro_export]
macro_rules! on_both_generations {
    ($suite:ident) => {
        mod $suite {
            #[test]
            #[ignore = "needs root and containerd: run by scripts/test.d/30-containerd.sh"]
            fn containerd_1_6() {
                super::$suite($crate::Generation::Debian)
            }

            #[test]
            #[ignore = "needs root and containerd: run by scripts/test.d/30-containerd.sh"]
            fn containerd_2() {
                super::$suite($crate::Generation::Current)
            }
        }
    };
}
