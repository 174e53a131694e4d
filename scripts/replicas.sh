#!/usr/bin/env bash
# Runs N independent `spillway serve` replicas on this host behind HAProxy with session affinity
# (deploy/haproxy/spillway.cfg; docs/deploy.md), in the foreground. Ctrl-C or SIGTERM stops them all:
# HAProxy stops taking connections, replicas finish their requests (serve's --shutdown-grace), then
# everything exits. A second Ctrl-C kills at once.
#
#   scripts/replicas.sh [--replicas N] [--gpus-per-replica G] [--port P] [-- SERVE_ARGS...]
#
#   --replicas N          replicas to start (default: GPUs / G, or 2 without GPUs; at most 8, the config's limit)
#   --gpus-per-replica G  GPUs each replica sees: replica i gets GPUs (i-1)*G .. i*G-1 through
#                         CUDA_VISIBLE_DEVICES (default 1 when nvidia-smi lists GPUs, else 0: no GPU, CPU runner)
#   --port P              clients connect to 127.0.0.1:P (default 8000); replica i listens on 127.0.0.1:P+i.
#                         SPILLWAY_LB_BIND overrides the address clients use (e.g. :8000 for every interface)
#   SERVE_ARGS            passed to every replica, e.g. -- --model /models/v41 --api-key KEY
#
# Replica logs go to one file each in $SPILLWAY_REPLICAS_LOG_DIR (default: a new folder under /tmp);
# HAProxy's request log goes to this terminal. The binary is $SPILLWAY_BIN (default build/bin/spillway).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "replicas.sh: $*" >&2; exit 1; }

n_gpus=0
command -v nvidia-smi > /dev/null && n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
replicas="" gpus_per_replica="" port=8000 serve_args=()
while (($#)); do
  case $1 in
    --replicas) replicas=${2:?--replicas needs a number}; shift 2 ;;
    --gpus-per-replica) gpus_per_replica=${2:?--gpus-per-replica needs a number}; shift 2 ;;
    --port) port=${2:?--port needs a number}; shift 2 ;;
    --) shift; serve_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (serve's own flags go after --; see --help)" ;;
  esac
done
for a in "${serve_args[@]}"; do
  case $a in
    --port|--port=*|--host|--host=*) die "'$a': each replica's address is set here (--port P gives replica i P+i)" ;;
  esac
done
[[ -z $gpus_per_replica ]] && gpus_per_replica=$((n_gpus > 0 ? 1 : 0))
if [[ -z $replicas ]]; then
  replicas=$((gpus_per_replica > 0 ? n_gpus / gpus_per_replica : 2))
fi
[[ $replicas =~ ^[0-9]+$ && $gpus_per_replica =~ ^[0-9]+$ && $port =~ ^[0-9]+$ ]] || die "numbers expected"
((replicas >= 1 && replicas <= 8)) || die "--replicas $replicas: 1 to 8 (deploy/haproxy/spillway.cfg lists 8 servers)"
((replicas * gpus_per_replica <= n_gpus || gpus_per_replica == 0)) ||
  die "$replicas replicas x $gpus_per_replica GPUs need $((replicas * gpus_per_replica)) GPUs; nvidia-smi lists $n_gpus"

bin=${SPILLWAY_BIN:-build/bin/spillway}
[[ -x $bin ]] || die "no spillway binary at $bin (build it with scripts/build.sh, or set SPILLWAY_BIN)"
haproxy=$(command -v haproxy || command -v /usr/sbin/haproxy || true)
[[ -n $haproxy ]] || die "haproxy is not installed (scripts/setup.sh installs it: Debian package haproxy)"
log_dir=${SPILLWAY_REPLICAS_LOG_DIR:-$(mktemp -d /tmp/spillway-replicas.XXXXXX)}
mkdir -p "$log_dir"

# Children run in their own sessions (setsid), so a Ctrl-C reaches only this script, which then stops
# them in order: HAProxy would otherwise drop in-flight streams at once while the replicas drain them.
replica_pids=() lb_pid="" stopping=0
stop_all() {
  if ((stopping)); then
    kill -KILL "${replica_pids[@]}" $lb_pid 2>/dev/null || true
    exit 1
  fi
  stopping=1
  echo "replicas.sh: stopping (replicas finish their requests; Ctrl-C again to kill)" >&2
  [[ -z $lb_pid ]] || kill -USR1 "$lb_pid" 2>/dev/null || true  # HAProxy's soft stop: no new connections
  kill -TERM "${replica_pids[@]}" 2>/dev/null || true
  for p in "${replica_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -z $lb_pid ]] || { kill -TERM "$lb_pid" 2>/dev/null; wait "$lb_pid" 2>/dev/null; } || true
  exit "${1:-0}"
}
trap 'stop_all 0' INT TERM

lb_env=()
for ((i = 1; i <= replicas; i++)); do
  gpu_env=()
  if ((gpus_per_replica > 0)); then
    gpu_env=(CUDA_VISIBLE_DEVICES="$(seq -s, $(((i - 1) * gpus_per_replica)) $((i * gpus_per_replica - 1)))")
  elif ((n_gpus > 0)); then
    gpu_env=(CUDA_VISIBLE_DEVICES=)  # CPU replicas on a GPU host: hide the GPUs
  fi
  setsid env "${gpu_env[@]}" "$bin" serve --port $((port + i)) "${serve_args[@]}" > "$log_dir/replica$i.log" 2>&1 &
  replica_pids+=($!)
  lb_env+=("SPILLWAY_REPLICA_$i=127.0.0.1:$((port + i))")
  echo "replica $i: 127.0.0.1:$((port + i)) ${gpu_env[*]:-} (log: $log_dir/replica$i.log)" >&2
done

echo "replicas.sh: waiting for the replicas to load the model" >&2
for ((i = 1; i <= replicas; i++)); do
  until curl -sf "http://127.0.0.1:$((port + i))/health" > /dev/null; do
    if ! kill -0 "${replica_pids[i - 1]}" 2>/dev/null; then
      tail -20 "$log_dir/replica$i.log" >&2
      echo "replicas.sh: replica $i exited while starting (log above: $log_dir/replica$i.log)" >&2
      stop_all 1
    fi
    sleep 0.5
  done
done

env "${lb_env[@]}" SPILLWAY_LB_BIND="${SPILLWAY_LB_BIND:-127.0.0.1:$port}" \
  setsid "$haproxy" -db -f deploy/haproxy/spillway.cfg &
lb_pid=$!
echo "replicas.sh: serving on http://${SPILLWAY_LB_BIND:-127.0.0.1:$port}/v1 (send X-Session-Id per conversation;" \
     "HAProxy status: http://${SPILLWAY_LB_STATS:-127.0.0.1:8404}/)" >&2

# A replica that exits is taken out by HAProxy's health check and its conversations move to the others;
# serving goes on while one replica is left. HAProxy exiting ends everything.
alive=$replicas
while :; do
  done_pid="" rc=0
  wait -n -p done_pid || rc=$?
  [[ -z $done_pid ]] && continue  # a trapped signal interrupted the wait
  if [[ $done_pid == "$lb_pid" ]]; then
    lb_pid=""
    echo "replicas.sh: haproxy exited ($rc)" >&2
    stop_all 1
  fi
  for ((i = 1; i <= replicas; i++)); do
    [[ ${replica_pids[i - 1]} == "$done_pid" ]] && echo "replicas.sh: replica $i exited ($rc; log: $log_dir/replica$i.log)" >&2
  done
  ((--alive > 0)) || { echo "replicas.sh: no replica left" >&2; stop_all 1; }
done
