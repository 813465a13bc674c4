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
		# The fuzz engine sometimes ends a clean run with "context deadline exceeded" and no crasher
		# (its deadline hit a worker mid-input): that run is tried once more; a real crasher is not.
		for attempt in 1 2; do
			log=$(mktemp)
			if go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimizetime" "$pkg" 2>&1 | tee "$log"; then
				rm -f "$log"
				break
			fi
			if [ "$attempt" = 1 ] && grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written to' "$log"; then
				echo "--- $target: engine deadline without a crasher; running it once more"
				rm -f "$log"
				continue
			fi
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
