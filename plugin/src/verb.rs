//! The CNI verbs (`CNI_COMMAND`): a leaf that the request, the errors and the replies share.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }

    /// The verb `as_str` names `s`.
    pub fn parse(s: &str) -> Option<Command> {
        use Command::*;
        let all = [Add, Del, Check, Status, Gc, Version];
        all.into_iter().find(|c| c.as_str() == s)
    }
}
