//! Conformance suites: cni-guard under cnitool and containerd, in network namespaces.
