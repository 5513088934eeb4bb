#!/usr/bin/env bash
# The results archive (reports/README.md "Archive") on branch $ARCHIVE_BRANCH of $GITHUB_REPOSITORY, at results/archive.
#   fetch [STORE INPUTS...]: check the branch out there (depth 1: the files, not their history); none yet: start it
#          empty. Given a STORE that exists (restored from the cache) and the INPUTS merge will read, only what
#          merging them needs: a partial clone (no file contents) whose sparse checkout holds answers/, remedies/ and the
#          entries `python -m reports archive-needs` names ($ARCHIVE_PYTHON, default python: an interpreter with the
#          reports package's dependencies); the other entries are in the index, so `verify` still sees their names.
#          Without a STORE (a lost cache: `rebuild` reads everything), every file.
#   push:  commit what `python -m reports merge` added and push it; when another run pushed first, put these
#          new files on top of its commit (entries are never changed, so nothing can conflict) and try again.
# GITHUB_TOKEN authenticates each git call on its command line: nothing is written to .git/config.
set -euo pipefail
: "${ARCHIVE_BRANCH:?}" "${GITHUB_TOKEN:?}" "${GITHUB_REPOSITORY:?}" "${GITHUB_SERVER_URL:?}"
basic=$(printf 'x-access-token:%s' "$GITHUB_TOKEN" | base64 -w0)
echo "::add-mask::$basic"
authed() { git -c http.extraheader="AUTHORIZATION: basic $basic" "$@"; }
harness=$PWD
mkdir -p results/archive
cd results/archive

commit() {
  git -c user.name="autotp-matrix" -c user.email="autotp-matrix@users.noreply.github.com" \
    commit -q -m "Results of $GITHUB_WORKFLOW run $GITHUB_RUN_ID attempt $GITHUB_RUN_ATTEMPT ($GITHUB_JOB)"
}

case "${1:-}" in
  fetch)
    shift
    store=${1:-}
    [ -z "$store" ] || shift
    git init -q
    git remote add origin "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY.git"
    found=0
    authed ls-remote --exit-code origin "refs/heads/$ARCHIVE_BRANCH" > /dev/null || found=$?
    if [ "$found" = 0 ] && [ -n "$store" ] && [ -f "$harness/$store" ] && [ "$#" -gt 0 ]; then
      authed fetch -q --depth=1 --filter=blob:none origin "$ARCHIVE_BRANCH"
      names=$(mktemp)
      git ls-tree -r --name-only FETCH_HEAD > "$names"
      inputs=()
      for input in "$@"; do inputs+=("$(cd "$harness" && realpath "$input")"); done
      needed=$(cd "$harness" && "${ARCHIVE_PYTHON:-python}" -m reports archive-needs --names "$names" \
        --store "$store" "${inputs[@]}")
      rm "$names"
      # Non-cone patterns anchored at the root: entry names are percent-encoded (no glob characters).
      { echo "/answers/"; echo "/remedies/"; [ -z "$needed" ] || sed 's|^|/|' <<< "$needed"; } | git sparse-checkout set --no-cone --stdin
      authed checkout -q -B "$ARCHIVE_BRANCH" FETCH_HEAD  # fetches the contents of the checked-out files only
      echo "partial checkout: $(grep -c . <<< "$needed" || true) entr(ies) of $(git ls-files '*/*.tar.gz' | wc -l) read"
    elif [ "$found" = 0 ]; then
      authed fetch -q --depth=1 origin "$ARCHIVE_BRANCH"
      git checkout -q -B "$ARCHIVE_BRANCH" FETCH_HEAD
    elif [ "$found" = 2 ]; then
      echo "::notice::no $ARCHIVE_BRANCH branch yet: this run starts the results archive"
      git checkout -q --orphan "$ARCHIVE_BRANCH"
    else
      echo "::error::cannot reach branch $ARCHIVE_BRANCH (git ls-remote exit $found)"
      exit 1
    fi
    echo "$(git ls-files '*.tar.gz' | wc -l) archived run(s), $(git ls-files 'answers/*.json' | wc -l) answer(s)," \
      "$(git ls-files 'remedies/*.json' | wc -l) remedy result(s)"
    ;;
  push)
    git add --sparse -A .
    if git diff --cached --quiet; then echo "nothing new for the archive"; exit 0; fi
    commit
    ours=$(git rev-parse HEAD)
    for try in 1 2 3 4 5; do
      if authed push -q origin "HEAD:refs/heads/$ARCHIVE_BRANCH"; then exit 0; fi
      sleep $((try * 10))
      authed fetch -q --depth=1 --filter=blob:none origin "$ARCHIVE_BRANCH"
      # The other run's commit, then this run's new files on top of it (only added files: nothing can conflict).
      authed checkout -q -B "$ARCHIVE_BRANCH" FETCH_HEAD
      authed cherry-pick --no-commit "$ours" > /dev/null
      git diff --cached --quiet || commit  # the other run may have pushed the very same entries
    done
    echo "::error::could not push the results archive to $ARCHIVE_BRANCH"
    exit 1
    ;;
  *)
    echo "usage: $0 fetch [STORE INPUTS...] | push" >&2
    exit 2
    ;;
esac
