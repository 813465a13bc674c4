#!/usr/bin/env bash
# Runs every Go fuzz target of the module, one at a time, each for the given time (default 20s).
# Targets are discovered per package with `go test -list` (in the packages whose test files
# declare one), so a new Fuzz function needs no edit here. Every target runs even after one fails;
# the script exits non-zero if any failed or if no target was found (a silent "nothing to fuzz"
# would hide a broken discovery).
#
#   hack/fuzz.sh [FUZZTIME]     e.g. hack/fuzz.sh 60s, hack/fuzz.sh 5000x
#
# FUZZMINIMIZETIME (default 10s) bounds the minimization of each new input: go's default, 60s,
# can spend most of a short run minimizing instead of fuzzing.
set -euo pipefail

fuzztime="${1:-20s}"
minimizetime="${FUZZMINIMIZETIME:-10s}"
cd "$(dirname "$0")/.."

failed=()
count=0
# Only packages whose test files declare a Fuzz function are listed: `go test -list` compiles a
# package's tests (without -race, so not what the unit stage built), and compiling every package's
# took most of this stage on a cold machine. The unit stage builds every test package anyway.
module=$(go list -m)
pkgs=$(grep -rlE --include='*_test.go' --exclude-dir=bin --exclude-dir=.git '^func Fuzz[A-Za-z0-9_]*\(' . |
	xargs -r -n1 dirname | sort -u | sed "s|^\.|$module|")
for pkg in $pkgs; do
	# -list compiles the package's tests; a package whose tests do not build is a failure.
	if ! targets=$(go test -run '^$' -list '^Fuzz' "$pkg" 2>&1); then
		echo "FAIL listing fuzz targets of $pkg:" >&2
		echo "$targets" >&2
		failed+=("$pkg (list)")
		continue
	fi
	for target in $(grep -E '^Fuzz[A-Za-z0-9_]*$' <<<"$targets" || true); do
		count=$((count + 1))
		echo "=== fuzz $pkg $target for $fuzztime"
		# -run '^$' skips the package's other tests; the target's seed corpus runs as part of fuzzing.
		#
		# A duration budget (-fuzztime 5s) is a context deadline inside Go's fuzzing coordinator,
		# and the coordinator can report that deadline as the target's failure ("context deadline
		# exceeded", no crasher written): it compares the deadline's error against a child
		# context's before the child has been cancelled (internal/fuzz, CoordinateFuzzing's stop),
		# a race that a loaded 2-core machine loses now and then. Such a run is tried once more
		# with an iteration budget (as many execs as the first run made), which sets no deadline
		# and so cannot lose that race; its first output is shown indented ("  race| "), its FAIL
		# words as "raced", so that they are not read as a test result. A run that wrote a crasher fails at once.
		budget="$fuzztime"
		for attempt in 1 2; do
			log=$(mktemp)
			status=0
			go test -run '^$' -fuzz "^${target}\$" -fuzztime "$budget" -fuzzminimizetime "$minimizetime" "$pkg" >"$log" 2>&1 || status=$?
			if [ "$status" = 0 ]; then
				cat "$log"
				rm -f "$log"
				break
			fi
			execs=$(grep -oE 'execs: [0-9]+' "$log" | tail -n1 | grep -oE '[0-9]+' || true)
			if [ "$attempt" = 1 ] && grep -qx '    context deadline exceeded' "$log" &&
				! grep -q 'Failing input written to' "$log" && [ -n "$execs" ] && [ "$execs" -gt 0 ]; then
				sed -e 's/--- FAIL/--- raced/' -e 's/^FAIL/raced/' -e 's/^/  race| /' "$log"
				echo "--- $target: the coordinator's deadline race (no crasher); once more for ${execs}x"
				budget="${execs}x"
				rm -f "$log"
				continue
			fi
			cat "$log"
			rm -f "$log"
			failed+=("$pkg $target")
			break
		done
	done
done

if [ "$count" -eq 0 ]; then
	echo "FAIL: no fuzz targets found" >&2
	exit 1
fi
if [ "${#failed[@]}" -gt 0 ]; then
	echo "FAIL: ${#failed[@]} of $count fuzz targets failed:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	echo "Crashers are in the package's testdata/fuzz/<target>/; commit them as regression cases." >&2
	exit 1
fi
echo "ok: $count fuzz targets, $fuzztime each"
