#!/usr/bin/env bash
# detached.sh: a command that outlives the shell that started it, for a remote shell whose commands have
# a time limit (a GPU round longer than one call): started in a session of its own, collected later.
#   detached.sh start DIR CMD [ARG...]  runs CMD: its output in DIR/log, its exit code in DIR/rc once it
#                                       ends; refused while DIR's command still runs
#   detached.sh wait DIR [SECONDS]      waits up to SECONDS (default 540) for it and prints the log's last
#                                       lines (DETACHED_TAIL, default 20); exit 0 once it has ended (its
#                                       own code in DIR/rc), 3 while it still runs, 2 if none was started
#   detached.sh stop DIR                SIGTERM to its process group
# e.g. one call: `bash profiles/detached.sh start /tmp/r bash bundle/gpu_round.sh /tmp/round;
# bash profiles/detached.sh wait /tmp/r 540`, the next calls: `bash profiles/detached.sh wait /tmp/r 540`.
set -u
usage() {
    echo "usage: detached.sh start DIR CMD [ARG...] | wait DIR [SECONDS] | stop DIR" >&2
    exit 2
}
[ $# -ge 2 ] || usage
verb=$1 dir=$2
shift 2
running() { [ -e "$dir/pid" ] && [ ! -e "$dir/rc" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }
case $verb in
start)
    [ $# -gt 0 ] || usage
    if running; then
        echo "detached: $dir: pid $(cat "$dir/pid") still runs" >&2
        exit 2
    fi
    mkdir -p "$dir" && rm -f "$dir/rc" "$dir/log" "$dir/pid"
    # setsid: a session (and process group) of its own, so that the caller's end does not end it
    setsid bash -c 'd=$1; shift; "$@" >"$d/log" 2>&1 </dev/null; echo $? >"$d/rc.part"; mv "$d/rc.part" "$d/rc"' \
        detached "$dir" "$@" &
    echo $! >"$dir/pid"
    echo "detached: started pid $! ($*), output in $dir/log"
    ;;
wait)
    secs=${1:-540}
    [ -e "$dir/pid" ] || { echo "detached: $dir: nothing was started there" >&2; exit 2; }
    t0=$(date +%s)
    while [ ! -e "$dir/rc" ] && running && [ $(($(date +%s) - t0)) -lt "$secs" ]; do sleep 2; done
    tail -n "${DETACHED_TAIL:-20}" "$dir/log" 2>/dev/null
    if [ -e "$dir/rc" ]; then
        echo "detached: ended, exit $(cat "$dir/rc")"
        exit 0
    fi
    if ! running; then
        echo "detached: $dir: the command is gone without an exit code (killed)" >&2
        exit 2
    fi
    echo "detached: still running after $secs s"
    exit 3
    ;;
stop)
    [ -e "$dir/pid" ] && kill -TERM -- "-$(cat "$dir/pid")" 2>/dev/null
    echo "detached: SIGTERM sent to $dir's command"
    ;;
*) usage ;;
esac
