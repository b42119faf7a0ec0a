#!/usr/bin/env bash
# Spark resource discovery script for fusedcomm: prints one GPU for the caller, as
#   {"name":"gpu","addresses":["<index>"]}
#
# Use it as spark.executor.resource.gpu.discoveryScript (and spark.worker.resource.gpu.discoveryScript
# for standalone workers). fusedcomm needs exactly one GPU per executor, and every worker or
# executor on a host runs this same script (in local-cluster mode all workers even share one JVM),
# so each call claims a GPU that no live process holds yet:
#
#   - A claim is a directory  $FUSEDCOMM_GPU_CLAIM_DIR/gpu-<index>  (default dir
#     /tmp/fusedcomm-gpu-claims), created with mkdir, which is atomic: of two callers racing for
#     one index exactly one wins. The directory holds a file "owner": the PID of the process that
#     ran this script ($PPID, the worker or executor JVM) and that process's start time.
#   - A claim whose owner has exited (or whose PID now belongs to a different process) is stale and
#     is reclaimed; the stale directory is first renamed away, so only one caller can reclaim it.
#   - Claims are never released explicitly: they end when their owner process ends.
#
# The GPU list comes from `nvidia-smi --query-gpu=index --format=csv,noheader`, or, for tests,
# from FUSEDCOMM_FAKE_GPUS=N (indices 0..N-1). FUSEDCOMM_GPU_RESOURCE_NAME overrides the resource
# name printed (default gpu; must match spark.fusedcomm.gpu.resourceName).
# With no GPU, or none free, it prints an empty address list and the reason on stderr; Spark then
# refuses to start an executor that asks for a GPU.

set -u

name="${FUSEDCOMM_GPU_RESOURCE_NAME:-gpu}"
claim_dir="${FUSEDCOMM_GPU_CLAIM_DIR:-/tmp/fusedcomm-gpu-claims}"
owner_pid="$PPID"

# Start time of a process (field 22 of /proc/<pid>/stat), empty if unknown or not running.
start_time() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  # Drop "pid (comm) " first: comm may contain spaces.
  stat="${stat##*) }"
  # shellcheck disable=SC2086
  set -- $stat
  echo "${20:-}"
}

alive() {
  if [ -d /proc ] && [ -r /proc/self/stat ]; then
    [ -d "/proc/$1" ]
  else
    kill -0 "$1" 2>/dev/null
  fi
}

# Success if the claim directory $1 is stale: its owner has exited or its PID was reused.
# A claim directory without an owner file is in the middle of being written unless it is old.
is_stale() {
  local dir="$1" pid started now mtime
  if ! read -r pid started <"$dir/owner" 2>/dev/null; then
    now="$(date +%s)"
    mtime="$(stat -c %Y "$dir" 2>/dev/null || echo "$now")"
    [ $((now - mtime)) -gt 10 ]
    return
  fi
  case "$pid" in '' | *[!0-9]*) return 0 ;; esac
  alive "$pid" || return 0
  [ -n "${started:-}" ] && [ "$started" != "$(start_time "$pid")" ] && return 0
  return 1
}

emit() {
  # $1: an address, or empty for none
  if [ -n "$1" ]; then
    printf '{"name":"%s","addresses":["%s"]}\n' "$name" "$1"
  else
    printf '{"name":"%s","addresses":[]}\n' "$name"
  fi
}

if [ -n "${FUSEDCOMM_FAKE_GPUS:-}" ]; then
  case "$FUSEDCOMM_FAKE_GPUS" in
    *[!0-9]*)
      echo "gpu-discovery: FUSEDCOMM_FAKE_GPUS must be a number, got '$FUSEDCOMM_FAKE_GPUS'" >&2
      emit ""
      exit 0
      ;;
  esac
  gpus="$(seq 0 $((FUSEDCOMM_FAKE_GPUS - 1)) 2>/dev/null)"
elif command -v nvidia-smi >/dev/null 2>&1; then
  if ! gpus="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>&1)"; then
    echo "gpu-discovery: nvidia-smi failed: $gpus" >&2
    emit ""
    exit 0
  fi
else
  echo "gpu-discovery: nvidia-smi not found; this host has no usable NVIDIA GPU" >&2
  emit ""
  exit 0
fi

gpus="$(printf '%s\n' "$gpus" | tr -d ' \r' | grep -E '^[0-9]+$' || true)"
if [ -z "$gpus" ]; then
  echo "gpu-discovery: no GPU found on this host" >&2
  emit ""
  exit 0
fi

if ! mkdir -p "$claim_dir" 2>/dev/null; then
  echo "gpu-discovery: cannot create claim directory $claim_dir" >&2
  emit ""
  exit 0
fi

owner_line="$owner_pid $(start_time "$owner_pid")"
for idx in $gpus; do
  dir="$claim_dir/gpu-$idx"
  # Two rounds: the second after reclaiming a stale claim.
  for _ in 1 2; do
    if mkdir "$dir" 2>/dev/null; then
      printf '%s\n' "$owner_line" >"$dir/owner.tmp.$$" && mv -f "$dir/owner.tmp.$$" "$dir/owner"
      emit "$idx"
      exit 0
    fi
    is_stale "$dir" || break
    # Rename is atomic: only one racer moves the stale claim away; the others' mv fails.
    if mv "$dir" "$dir.stale.$$" 2>/dev/null; then
      rm -rf "$dir.stale.$$"
    fi
  done
done

echo "gpu-discovery: all GPUs of this host ($(echo $gpus | tr ' ' ',')) are claimed by live processes (see $claim_dir)" >&2
emit ""
exit 0
