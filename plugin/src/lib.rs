//! cni-guard: a CNI meta-plugin that refuses ADD until its delegate network is complete.

pub mod operator;
