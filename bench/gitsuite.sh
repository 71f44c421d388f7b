#!/usr/bin/env bash
# bench/gitsuite.sh: git's own HTTP test scripts, against stock git-http-backend and against aspen-cgi.
#
# Usage: bench/gitsuite.sh [options] GIT_SOURCE_DIR
#
# GIT_SOURCE_DIR is a source tree of git of the same version as the installed
# `git` (release tarball, `git archive vX.Y.Z`, or a work tree at the tag);
# this script never downloads anything. It copies the tree into a build
# directory, builds it (make, NO_GETTEXT, NO_TCLTK, NO_PYTHON), then runs each
# selected script of its t/ twice: once with the git-http-backend that make
# built, once with a shim in its place that execs aspen-cgi. git's tests run
# git-http-backend from the build directory (GIT_EXEC_PATH; Apache's
# ScriptAlias in t/lib-httpd/apache.conf, and `git http-backend` in t5560 and
# t5562), so the shim is all that changes between the two runs.
#
# The scripts: every t/t*.sh that sources lib-httpd.sh or t556x_common or runs
# `git http-backend` itself, and those that source one of them (t5559 runs
# t5551 over HTTP/2). They refuse to start Apache as root, so when this
# script runs as root they run as an unprivileged user (default
# aspen-gitsuite, created with useradd if missing) that owns the build
# directory; run by another user, they run as that user.
#
# Options:
#   --out DIR          results: results.md (the table), logs/{stock,aspen}/*.log
#                      (default /tmp/aspen-gitsuite/results-<date>-<time>)
#   --build-dir DIR    where the source is copied and built (default
#                      /tmp/aspen-gitsuite/git-<version>); a directory already
#                      holding this script's build of the same version is reused
#                      (make runs again and does nothing when nothing changed)
#   --no-build         use --build-dir as it is, without running make
#   --build-only       build, check, and stop
#   --only LIST        only these scripts (comma-separated: t5551,t5541-http-push-smart)
#   --skip LIST        not these scripts
#   --backends LIST    stock,aspen (default both, in that order)
#   --timeout SECS     per script and backend (default 1200); a script past it is killed
#   --test-opts OPTS   options of each test script (default "-v"; "-v -x" traces commands)
#   --long             GIT_TEST_LONG=true: the EXPENSIVE tests too (t5551's enormous ref negotiation)
#   --user NAME        the unprivileged user, when run as root (default aspen-gitsuite)
#   --aspen-cgi PATH   Aspen's CGI program (default: this checkout's .venv/bin/aspen-cgi,
#                      made by ./run setup)
#   -j N               make's jobs (default 2)
#   --list             print the scripts that would run, and exit
#   -h, --help         this text
#
# Exit status: 0 when every script ran (whatever its results), 1 when a
# script could not run to its end (timeout, no summary), 2 for usage and set-up errors.
set -uo pipefail
umask 022

here=$(cd "$(dirname "$0")/.." && pwd)
prog=bench/gitsuite.sh

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "$prog: $*" >&2; exit 2; }
say() { echo "$prog: $*" >&2; }

out="" build="" no_build=0 build_only=0 only="" skip="" backends="stock,aspen" timeout_s=1200
test_opts="-v" long="" user=aspen-gitsuite aspen_cgi="$here/.venv/bin/aspen-cgi" jobs=2 list_only=0 src=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --out=*) out=${1#*=} ;;
    --build-dir) build=${2:?--build-dir needs a directory}; shift ;;
    --build-dir=*) build=${1#*=} ;;
    --no-build) no_build=1 ;;
    --build-only) build_only=1 ;;
    --only) only=${2:?--only needs a list}; shift ;;
    --only=*) only=${1#*=} ;;
    --skip) skip=${2:?--skip needs a list}; shift ;;
    --skip=*) skip=${1#*=} ;;
    --backends) backends=${2:?}; shift ;;
    --backends=*) backends=${1#*=} ;;
    --timeout) timeout_s=${2:?}; shift ;;
    --timeout=*) timeout_s=${1#*=} ;;
    --test-opts) test_opts=${2?}; shift ;;
    --test-opts=*) test_opts=${1#*=} ;;
    --user) user=${2:?}; shift ;;
    --user=*) user=${1#*=} ;;
    --aspen-cgi) aspen_cgi=${2:?}; shift ;;
    --aspen-cgi=*) aspen_cgi=${1#*=} ;;
    -j) jobs=${2:?}; shift ;;
    -j*) jobs=${1#-j} ;;
    --list) list_only=1 ;;
    --long) long=true ;;
    -*) die "unknown option $1 (--help)" ;;
    *) [ -z "$src" ] || die "one GIT_SOURCE_DIR only (--help)"; src=$1 ;;
  esac
  shift
done
[ -n "$src" ] || { usage >&2; exit 2; }
[ -d "$src/t" ] && [ -f "$src/GIT-VERSION-GEN" ] || die "$src is not a git source tree (no t/ or GIT-VERSION-GEN)"
src=$(cd "$src" && pwd)
case "$timeout_s" in ''|*[!0-9]*) die "--timeout: a number of seconds" ;; esac
for b in ${backends//,/ }; do
  case "$b" in stock|aspen) ;; *) die "--backends: stock and/or aspen, not $b" ;; esac
done

# --- versions: the source's and the installed git's must be the same -------------------------
installed=$(git --version 2>/dev/null | awk '{print $3}') || true
[ -n "$installed" ] || die "no git installed (git --version)"
if [ -f "$src/version" ]; then        # release tarballs
  srcver=$(head -n1 "$src/version")
else                                  # git archive / a checkout: the version the tree itself names
  srcver=$(sed -n 's/^DEF_VER=v\{0,1\}//p' "$src/GIT-VERSION-GEN" | head -n1)
fi
[ "$srcver" = "$installed" ] ||
  die "the source tree is git $srcver, the installed git is $installed: give the source of $installed"

: "${build:=/tmp/aspen-gitsuite/git-$installed}"
: "${out:=/tmp/aspen-gitsuite/results-$(date +%Y%m%d-%H%M%S)}"

# --- who runs the tests ----------------------------------------------------------------------
if [ "$(id -u)" = 0 ]; then
  if ! id -u "$user" >/dev/null 2>&1; then
    [ "$list_only" = 1 ] || {
      say "creating the unprivileged user $user (the HTTP tests refuse to run as root)"
      useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user" ||
        die "useradd $user failed"
    }
  fi
  as_user() { runuser -u "$user" -- "$@"; }
else
  user=$(id -un)
  as_user() { "$@"; }
fi

# the scripts of a t/ directory that exercise git-http-backend
select_scripts() {
  local tdir=$1 f base want direct again
  direct=$(cd "$tdir" && grep -lE 'lib-httpd\.sh|t556x_common|git http-backend' t[0-9]*.sh)
  # and those that source one of them (t5559: t5551 over HTTP/2 and TLS)
  again=$(cd "$tdir" && grep -lE "^\. \./($(echo $direct | sed 's/ /|/g; s/\./\\./g'))" t[0-9]*.sh)
  for f in $(printf '%s\n' $direct $again | sort -u); do
    base=${f%.sh}
    if [ -n "$only" ]; then
      want=0
      for w in ${only//,/ }; do case "$base" in "${w%.sh}"|"${w%.sh}"-*) want=1 ;; esac; done
      [ "$want" = 1 ] || continue
    fi
    for w in ${skip//,/ }; do case "$base" in "${w%.sh}"|"${w%.sh}"-*) continue 2 ;; esac; done
    echo "$base"
  done
}

if [ "$list_only" = 1 ]; then
  select_scripts "$src/t"
  exit 0
fi

# --- build -----------------------------------------------------------------------------------
stamp="$build/.gitsuite-built"
stock_copy="$build/.gitsuite-stock-http-backend"
shim_marker="# bench/gitsuite.sh: aspen-cgi in place of git-http-backend"

is_shim() { [ -f "$1" ] && grep -qF "$shim_marker" "$1" 2>/dev/null; }

if [ "$no_build" = 0 ]; then
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$installed $src" ]; then
    [ ! -e "$build" ] || [ -f "$stamp" ] || [ -z "$(ls -A "$build" 2>/dev/null)" ] ||
      die "$build exists and is not this script's build directory: give another --build-dir"
    say "copying $src to $build"
    rm -rf "$build"
    mkdir -p "$build" || die "cannot create $build"
    tar -C "$src" --exclude=./.git -cf - . | tar -C "$build" -xf - || die "copying the source failed"
  fi
  # what the tests need and no more; config.mak makes every later make (and GIT-BUILD-OPTIONS) agree
  cat >"$build/config.mak" <<'EOF'
# bench/gitsuite.sh
NO_GETTEXT = 1
NO_TCLTK = 1
NO_PYTHON = 1
EOF
  chown -R "$user" "$build" 2>/dev/null || [ "$(id -u)" != 0 ] || die "chown $build failed"
  # make must see the built program again, not the shim (which is newer than its objects)
  if is_shim "$build/git-http-backend"; then rm -f "$build/git-http-backend"; fi
  say "building git $installed in $build (make -j$jobs; the first build takes minutes)"
  mkdir -p "$out" || die "cannot create $out"
  if ! (cd "$build" && as_user make -j"$jobs" all) >"$out/build.log" 2>&1; then
    tail -n 30 "$out/build.log" >&2
    die "make failed: $out/build.log (build dependencies: gcc make libcurl4-openssl-dev zlib1g-dev libexpat1-dev)"
  fi
  cp -p "$build/git-http-backend" "$stock_copy" || die "no git-http-backend was built"
  echo "$installed $src" >"$stamp"
fi
[ -f "$stamp" ] && [ -x "$stock_copy" ] || die "$build holds no build of this script: run without --no-build"
built=$("$build/git" --version 2>/dev/null | awk '{print $3}')
[ "$built" = "$installed" ] || die "the build in $build is git $built, the installed git is $installed"
! grep -q "^NO_CURL='[^']" "$build/GIT-BUILD-OPTIONS" ||
  die "git in $build was built without libcurl (install libcurl4-openssl-dev and build again)"
[ -x /usr/sbin/apache2 ] || [ -x /usr/sbin/httpd ] ||
  die "no Apache (/usr/sbin/apache2): apt-get install apache2 (./run test installs it)"
perl -MIO::Pty -e 1 2>/dev/null ||
  say "no perl IO::Pty: the tests that need a terminal (TTY) are skipped (apt-get install libio-pty-perl)"
if [ "$build_only" = 1 ]; then say "built: $build"; exit 0; fi

# --- the shim --------------------------------------------------------------------------------
case " ${backends//,/ } " in
  *" aspen "*)
    [ -x "$aspen_cgi" ] || die "no $aspen_cgi: run ./run setup in $here, or give --aspen-cgi"
    aspen_cgi=$(cd "$(dirname "$aspen_cgi")" && pwd)/$(basename "$aspen_cgi")
    shim_text="#!/bin/sh
$shim_marker
exec '$aspen_cgi' \"\$@\""
    # can the test user start it? one info/refs over a repository of its own
    probe=$(as_user mktemp -d /tmp/aspen-gitsuite-probe.XXXXXX) || die "mktemp as $user failed"
    as_user git init -q --bare "$probe/r.git"
    answer=$(cd "$probe" && as_user env -i PATH="$PATH" GIT_PROJECT_ROOT="$probe" GIT_HTTP_EXPORT_ALL=1 \
      REQUEST_METHOD=GET PATH_INFO=/r.git/info/refs QUERY_STRING=service=git-upload-pack \
      SERVER_PROTOCOL=HTTP/1.1 REMOTE_ADDR=127.0.0.1 "$aspen_cgi" </dev/null 2>"$probe/err" | head -c 2000 | tr -d '\r')
    if ! grep -q '^Content-Type: application/x-git-upload-pack-advertisement' <<<"$answer"; then
      say "aspen-cgi did not answer as $user (venv and checkout must be readable by $user: o+rx on every directory up to them):"
      head -n 20 <<<"$answer" >&2; head -n 20 "$probe/err" >&2
      as_user rm -rf "$probe"
      exit 2
    fi
    as_user rm -rf "$probe"
    ;;
esac

install_backend() {   # stock | aspen
  local dst="$build/git-http-backend"
  rm -f "$dst"
  if [ "$1" = stock ]; then
    cp -p "$stock_copy" "$dst"
  else
    printf '%s\n' "$shim_text" >"$dst"
    chmod 755 "$dst"
  fi
  chown "$user" "$dst" 2>/dev/null || true
}

# --- run -------------------------------------------------------------------------------------
scripts=$(select_scripts "$build/t")
[ -n "$scripts" ] || die "no script matches (--list shows them)"
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
tdir="$build/t"

# ok/not ok lines of a log when the script left no counts (killed, crashed)
counts_from_log() {
  awk '/^ok [0-9]+ # skip /{s++; next} /^ok [0-9]+ - .*# TODO known breakage vanished/{x++; next}
       /^ok [0-9]+ - /{p++; next} /^not ok [0-9]+ - .*# TODO known breakage/{b++; next}
       /^not ok [0-9]+ - /{f++; next}
       END {printf "total %d\nsuccess %d\nfixed %d\nbroken %d\nfailed %d\n", p+f+s+b+x, p, x, b, f}' "$1"
}

leftovers() {   # processes of this build's scripts still running a few seconds after one ended: logged, ended by pid
  local pids pid i cwd
  for i in 1 2 3 4 5 6; do
    pids=""
    for pid in $(pgrep -u "$user" 2>/dev/null); do
      cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) || continue
      case "$cwd $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" in
        *"$build"*) pids="$pids $pid" ;;
      esac
    done
    [ -n "$pids" ] || return 0
    sleep 1     # Apache stopping, a background build finishing
  done
  echo "gitsuite: still running 6 s after the script ended (then killed):" >>"$1"
  ps -o pid,etimes,args -p "$(echo $pids | tr ' ' ',')" >>"$1" 2>/dev/null
  for pid in $pids; do kill "$pid" 2>/dev/null; done
  sleep 2
  for pid in $pids; do kill -9 "$pid" 2>/dev/null; done
}

run_one() {   # backend script
  local b=$1 s=$2 log="$out/logs/$1/$2.log" res="$out/logs/$1/$2.res" t0 t1 rc status counts trash
  trash="$tdir/trash directory.$s"
  rm -rf "$trash" "$tdir/test-results/$s.counts"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  (cd "$tdir" && as_user env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/nonexistent \
      LANG=C.UTF-8 GIT_TEST_HTTPD=true ${long:+GIT_TEST_LONG=true} \
      timeout -k 30 "$timeout_s" sh "./$s.sh" $test_opts) >"$log" 2>&1 </dev/null
  rc=$?
  t1=$(date +%s)
  # an Apache the script could not stop (killed by the timeout)
  if [ -f "$trash/httpd/httpd.pid" ]; then
    pid=$(cat "$trash/httpd/httpd.pid" 2>/dev/null)
    [ -z "$pid" ] || kill "$pid" 2>/dev/null
  fi
  leftovers "$log"
  if [ -f "$tdir/test-results/$s.counts" ]; then
    counts=$(cat "$tdir/test-results/$s.counts")
    status=done
  else
    counts=$(counts_from_log "$log")
    status=incomplete
  fi
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && status=timeout
  if grep -q '^1\.\.0 # SKIP' "$log"; then status="skipped: $(sed -n 's/^1\.\.0 # SKIP //p' "$log" | head -n1)"; fi
  { echo "$counts"; echo "rc $rc"; echo "secs $((t1 - t0))"; echo "status $status"; } >"$res"
  grep -E '^not ok [0-9]+ - ' "$log" | grep -v '# TODO known breakage' | sed 's/^not ok //' >"$out/logs/$b/$s.failed"
  # what is left of a failed script's trash directory: Apache's logs hold the backend's stderr
  if [ -d "$trash/httpd" ]; then
    cp "$trash/httpd/error.log" "$out/logs/$b/$s.httpd-error.log" 2>/dev/null
    cp "$trash/httpd/access.log" "$out/logs/$b/$s.httpd-access.log" 2>/dev/null
  fi
  if [ -d "$trash" ]; then
    mkdir -p "$out/trash/$b"
    rm -rf "$out/trash/$b/$s"
    mv "$trash" "$out/trash/$b/$s" 2>/dev/null || rm -rf "$trash"
  fi
  printf '%s\n' "$status" | head -n1
}

val() { awk -v k="$2" '$1 == k {print $2}' "$1" 2>/dev/null; }

# however the run ends, the build is left with stock's git-http-backend
trap 'install_backend stock' EXIT
trap 'exit 130' INT TERM
nscripts=$(wc -w <<<"$scripts")
say "$nscripts scripts × backends ${backends}; results in $out"
start=$(date +%s)
incomplete=0
for b in ${backends//,/ }; do
  mkdir -p "$out/logs/$b"
  install_backend "$b"
  i=0
  for s in $scripts; do
    i=$((i + 1))
    printf '%s: [%s %d/%d] %s ... ' "$prog" "$b" "$i" "$nscripts" "$s" >&2
    st=$(run_one "$b" "$s")
    r="$out/logs/$b/$s.res"
    printf '%s, %s ok, %s failed, %ss\n' "$st" "$(val "$r" success)" "$(val "$r" failed)" "$(val "$r" secs)" >&2
    case "$st" in done|skipped*) ;; *) incomplete=1 ;; esac
  done
done
install_backend stock
wall=$(( $(date +%s) - start ))

# --- the table -------------------------------------------------------------------------------
cell() {   # backend script -> "pass | fail | skip"
  local r="$out/logs/$1/$2.res" total succ fail broken fixed
  [ -f "$r" ] || { printf ' | | '; return; }
  total=$(val "$r" total) succ=$(val "$r" success) fail=$(val "$r" failed)
  broken=$(val "$r" broken) fixed=$(val "$r" fixed)
  printf '%s | %s | %s' "$((succ + fixed))" "$fail" "$((total - succ - fail - broken - fixed))"
}
note() {   # backend script -> what is unusual
  local r="$out/logs/$1/$2.res" st broken
  [ -f "$r" ] || return
  st=$(sed -n 's/^status //p' "$r"); broken=$(val "$r" broken)
  case "$st" in done) ;; *) printf '%s: %s (exit %s); ' "$1" "$st" "$(val "$r" rc)" ;; esac
  [ "${broken:-0}" = 0 ] || printf '%s: %s known breakage(s); ' "$1" "$broken"
}
aspen_only() {   # script -> the failures of aspen that stock does not have
  [ -f "$out/logs/aspen/$1.failed" ] || return
  if [ -f "$out/logs/stock/$1.failed" ]; then
    grep -vxFf "$out/logs/stock/$1.failed" "$out/logs/aspen/$1.failed"
  else
    cat "$out/logs/aspen/$1.failed"
  fi
}
excerpt() {   # script testline -> the verbose output of that test, up to its "not ok" line
  local n=${2%% *} num=${1#t}
  num=${num%%-*}
  awk -v start="expecting success of $num.$n " -v stop="not ok $n - " '
    index($0, start) == 1 {on = 1; buf = ""; k = 0}
    on {lines[k++] = $0}
    on && index($0, stop) == 1 {exit}
    END {from = (k > 60) ? k - 60 : 0; if (from) print "[... " from " lines]"; for (i = from; i < k; i++) print lines[i]}
  ' "$out/logs/aspen/$1.log"
}

{
  echo "# git's HTTP tests: stock git-http-backend and aspen-cgi"
  echo
  echo "git $installed (tests built from $src in $build), $(date -u +'%Y-%m-%d %H:%M UTC'), $(uname -n), $(nproc) cores."
  echo "Aspen: \`$aspen_cgi\` ($(cd "$here" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$here" && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && echo ', with uncommitted changes'))."
  echo "Each script ran as \`GIT_TEST_HTTPD=true ${long:+GIT_TEST_LONG=true }sh ./tNNNN-*.sh $test_opts\` as $user, timeout ${timeout_s}s; wall time ${wall}s."
  echo "pass/fail/skip count tests; known breakages (test_expect_failure) are in the notes."
  echo
  echo "| script | stock pass | stock fail | stock skip | aspen pass | aspen fail | aspen skip | aspen fails, stock passes | notes |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for s in $scripts; do
    n=$(aspen_only "$s" | grep -c .)
    printf '| %s | %s | %s | %s | %s |\n' "$s" "$(cell stock "$s")" "$(cell aspen "$s")" "$n" "$(note stock "$s")$(note aspen "$s")"
  done
  echo
  echo "## Tests aspen fails and stock passes"
  echo
  any=0
  for s in $scripts; do
    fails=$(aspen_only "$s")
    [ -n "$fails" ] || continue
    any=1
    echo "### $s"
    echo
    while IFS= read -r t; do echo "- $t"; done <<<"$fails"
    echo
    while IFS= read -r t; do
      echo "<details><summary>$t</summary>"
      echo
      echo '```'
      excerpt "$s" "$t"
      echo '```'
      echo
      echo "</details>"
      echo
    done <<<"$fails"
    printf 'Logs: `logs/aspen/%s.log`' "$s"
    [ ! -f "$out/logs/aspen/$s.httpd-error.log" ] || printf ', `logs/aspen/%s.httpd-error.log` (the backend'"'"'s stderr)' "$s"
    [ ! -d "$out/trash/aspen/$s" ] || printf '; trash directory: `trash/aspen/%s`' "$s"
    printf '.\n'
    echo
  done
  [ "$any" = 1 ] || echo "None."
} >"$out/results.md"

say "wall time ${wall}s; table: $out/results.md"
sed -n '/^| script/,/^$/p' "$out/results.md"
exit "$incomplete"
