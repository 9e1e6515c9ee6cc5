#!/usr/bin/env bash
# The nightly entrypoint: convert the manifest, back up the DB, write the dashboard, publish.
#
# Every scheduler runs this one script as a Ray job driver (KubeRay RayJob/RayCronJob, the
# Kubernetes CronJob's `ray job submit`, the AWS head's crontab), so the commands live here only.
# Settings come from the environment (a ConfigMap on Kubernetes, ~/zoo.env on AWS):
#
#   ZOO_MANIFEST       manifest Parquet file                                   (required)
#   ZOO_OUT            artifact folder every node sees, or an fsspec URL       (required)
#   ZOO_BACKUP         folder or fsspec URL the DB is backed up to             (required)
#   ZOO_DB             the DuckDB file, on the driver's own disk; restored from
#                      ZOO_BACKUP when missing       (default ~/zoo-state/results.duckdb)
#   ZOO_SITE           dashboard output folder                   (default ZOO_OUT/../site)
#   ZOO_ADDRESS        Ray address for the farm                            (default auto)
#   ZOO_MAX_IN_FLIGHT  jobs in flight at once                  (default: the farm's own)
#   ZOO_RUN_NAME       the run's name, for `db regressions --since NAME` and `publish --run NAME`
#                      (default nightly-<UTC start time>, unique even when a night is rerun)
#   ZOO_NAMESPACE      Hub organization to publish to; empty skips publishing
#   ZOO_HUB_REQUESTS_PER_5MIN   Hub API requests the token may make per 5 minutes, shared by
#                      the driver and every worker                  (default 1000, a free account)
#   ZOO_HUB_DOWNLOADS_PER_5MIN  Hub file downloads per 5 minutes             (default 5000)
#   ZOO_HUB_COMMITS_PER_HOUR    commits publishing may make per hour; the rest waits for the
#                      next night, first in line                                 (default 128)
#   ZOO_PYTHON         the interpreter zoo-convert is installed in        (default python3)
#
# Exit status: 0 when the farm ran (models that failed to convert are results, shown on the
# dashboard), the farm's status when it could not run, 75 when another run holds the DB.
set -euo pipefail

: "${ZOO_MANIFEST:?set ZOO_MANIFEST to the manifest Parquet file}"
: "${ZOO_OUT:?set ZOO_OUT to the artifact folder or URL every node sees}"
: "${ZOO_BACKUP:?set ZOO_BACKUP to the folder or URL the DB is backed up to}"
ZOO_DB="${ZOO_DB:-$HOME/zoo-state/results.duckdb}"
ZOO_SITE="${ZOO_SITE:-$(dirname "$ZOO_OUT")/site}"
ZOO_ADDRESS="${ZOO_ADDRESS:-auto}"
ZOO_MAX_IN_FLIGHT="${ZOO_MAX_IN_FLIGHT:-}"
ZOO_NAMESPACE="${ZOO_NAMESPACE:-}"
ZOO_HUB_REQUESTS_PER_5MIN="${ZOO_HUB_REQUESTS_PER_5MIN:-}"
ZOO_HUB_DOWNLOADS_PER_5MIN="${ZOO_HUB_DOWNLOADS_PER_5MIN:-}"
ZOO_HUB_COMMITS_PER_HOUR="${ZOO_HUB_COMMITS_PER_HOUR:-}"
ZOO_PYTHON="${ZOO_PYTHON:-python3}"

log() { printf '[nightly %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# fsspec comes with huggingface_hub, so local paths, s3:// and gs:// all go one way
# (s3:// needs s3fs and gs:// gcsfs installed beside it).
storage() {
  "$ZOO_PYTHON" - "$@" <<'PY'
import posixpath
import sys

import fsspec

op, *args = sys.argv[1:]
if op == "restore":  # restore URL LOCAL: fetch the latest backup if there is one
    fs, path = fsspec.core.url_to_fs(args[0])
    if fs.exists(path):
        fs.get_file(path, args[1])
        print(f"restored {args[0]}")
elif op == "backup":  # backup LOCAL URL...: copy to each URL
    for url in args[1:]:
        fs, path = fsspec.core.url_to_fs(url)
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.put_file(args[0], path)
        print(f"backed up to {url}")
PY
}

mkdir -p "$(dirname "$ZOO_DB")"
# One nightly at a time: a second one would restore or back up the DB mid-write. `zoo-convert run`
# takes the DB's own run lock ($ZOO_DB.lock) itself, so this one has another name; a run started
# by hand that holds the DB is noticed here too, before anything is restored or backed up.
exec 9>"$ZOO_DB.nightly.lock"
if ! flock --nonblock 9 || ! flock --nonblock "$ZOO_DB.lock" true; then
  log "another run holds $ZOO_DB; not starting"
  exit 75
fi

if [[ ! -e "$ZOO_DB" ]]; then
  log "no $ZOO_DB on this driver; restoring the last backup"
  storage restore "$ZOO_BACKUP/results.duckdb" "$ZOO_DB"
fi

run_name="${ZOO_RUN_NAME:-nightly-$(date -u +%Y-%m-%dT%H%M%SZ)}"
log "converting $ZOO_MANIFEST on $ZOO_ADDRESS as run $run_name"
run_status=0
zoo-convert run "$ZOO_MANIFEST" --db "$ZOO_DB" --out "$ZOO_OUT" --address "$ZOO_ADDRESS" --name "$run_name" \
  ${ZOO_MAX_IN_FLIGHT:+--max-in-flight "$ZOO_MAX_IN_FLIGHT"} \
  ${ZOO_HUB_REQUESTS_PER_5MIN:+--hub-requests-per-5min "$ZOO_HUB_REQUESTS_PER_5MIN"} \
  ${ZOO_HUB_DOWNLOADS_PER_5MIN:+--hub-downloads-per-5min "$ZOO_HUB_DOWNLOADS_PER_5MIN"} || run_status=$?

# Back up whatever the run recorded, even when it stopped early: the DB is the farm's memory.
if [[ -e "$ZOO_DB" ]]; then
  # A checkpoint folds any write-ahead log into the file, so the copy is the whole DB.
  "$ZOO_PYTHON" -c 'import duckdb, sys; duckdb.connect(sys.argv[1]).execute("CHECKPOINT").close()' "$ZOO_DB"
  storage backup "$ZOO_DB" "$ZOO_BACKUP/results-$(date -u +%Y%m%dT%H%M%SZ).duckdb" "$ZOO_BACKUP/results.duckdb"
fi
if (( run_status != 0 )); then  # run exits 0 whatever the models did: anything else stopped it
  log "the farm could not run (exit $run_status)"
  exit "$run_status"
fi

log "writing the dashboard to $ZOO_SITE"
zoo-convert dashboard --db "$ZOO_DB" --out "$ZOO_SITE"

if [[ -n "$ZOO_NAMESPACE" ]]; then
  log "publishing to $ZOO_NAMESPACE"
  zoo-convert publish --db "$ZOO_DB" --namespace "$ZOO_NAMESPACE" \
    ${ZOO_HUB_REQUESTS_PER_5MIN:+--hub-requests-per-5min "$ZOO_HUB_REQUESTS_PER_5MIN"} \
    ${ZOO_HUB_COMMITS_PER_HOUR:+--hub-commits-per-hour "$ZOO_HUB_COMMITS_PER_HOUR"}
else
  log "ZOO_NAMESPACE is empty; not publishing"
fi
log "done (farm exit $run_status)"
