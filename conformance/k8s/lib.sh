# Shared by the node's scripts (churn.sh, crash.sh): polling a status and reading the polls back.
# Sourced from the repository's root.

# poll_status FILE CMD...: in the background, about once a second while the sourcing script
# lives (kill -0 $$: it stops even if that script is SIGKILLed), run CMD and append "ms output"
# to FILE. A failed call or an empty answer is written as "ms ?": it is no status, but it is not
# dropped either (the readers below count it as not True, and apart). The poller holds neither
# the caller's stdout nor 35-kubernetes.sh's lock (fd 9). Its pid is in $! afterwards.
poll_status() {
  local file=$1
  shift
  (
    while kill -0 $$ 2>/dev/null; do
      if r=$("$@" 2>/dev/null) && [ -n "$r" ]; then echo "$(date +%s%3N) $r" >>"$file"
      else echo "$(date +%s%3N) ?" >>"$file"; fi
      sleep 1
    done
  ) >/dev/null 9>&- &
}

# seconds_not_true FILE: the seconds poll_status's FILE saw a status other than True (a failed
# poll included: unknown is not True), each such poll counting until the next one (to the
# nearest second); 0 for no polls.
seconds_not_true() {
  touch "$1"
  awk 'prev != "" && st != "True" { ms += $1 - prev } { prev = $1; st = $2 }
    END { print int((ms + 500) / 1000) }' "$1"
}

# seconds_unknown FILE: the part of seconds_not_true that follows failed polls ("?").
seconds_unknown() {
  touch "$1"
  awk 'prev != "" && st == "?" { ms += $1 - prev } { prev = $1; st = $2 }
    END { print int((ms + 500) / 1000) }' "$1"
}
