fn main() {
    if std::env::var_os("CNI_COMMAND").is_none() {
        std::process::exit(cni_guard::operator::run(
            std::env::args_os().skip(1).collect(),
        ));
    }
}
