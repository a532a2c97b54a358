//! Test tools for proving cni-guard on a real containerd through the CRI: a CRI client, a private
//! containerd in its own network namespace, CNI configs and leak inspection. Root only.
pub mod cni;
pub mod containerd;
pub mod cri;
pub mod netns;
pub mod prereq;

use std::path::Path;

pub use containerd::Containerd;

/// Builds the sandbox image, starts a private containerd, imports the image and fills its CNI
/// bin dir with the reference plugins and `extra` binaries (name in bin dir, source path).
pub fn start_containerd(extra: &[(&str, &Path)]) -> Containerd {
    let images = tempfile::tempdir().expect("temp dir");
    let tar = images.path().join("sandbox.tar");
    prereq::build_image("sandbox", &tar, &[containerd::SANDBOX_IMAGE]).expect("sandbox image");
    let ctrd = Containerd::start(&tar).unwrap_or_else(|e| panic!("start containerd: {e}"));
    prereq::populate_bin_dir(&ctrd.bin_dir(), extra).expect("CNI bin dir");
    ctrd
}
