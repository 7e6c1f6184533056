#!/usr/bin/env bash
# The CI steps, defined once. .ci/run, tox.ini and the GitHub workflows call this
# script by step name; each caller sets up its own environment (a venv with
# `pip install -c constraints.txt -e ".[dev,docs,browser]"`, a tox env, a CI job's matrix install),
# then runs the steps in it. tests/test_repo.py checks that every caller goes through
# here and that the tests step is the README's test command.
#
#   scripts/ci_steps.sh STEP [STEP ...]      run the steps in order, stop at the first failure
#   scripts/ci_steps.sh tests [PYTEST ARGS]   the tests step, extra arguments to pytest
#   scripts/ci_steps.sh --list               the step names
#
# Steps:
#   lint        ruff check and ruff format --check
#   actionlint  actionlint on .github/workflows/
#   mypy        mypy --strict on the package
#   tests       the README's test command
#   docs        the documentation site, every warning an error (needs the docs extra:
#               `pip install -c constraints.txt -e ".[docs]"`); into docs/_build/html
#   browser     every built page in headless Chromium at 1280 and 390 px
#               (tests/test_docs_browser.py: error boxes, overflow, broken links and
#               images, console errors), after docs; needs the browser extra and a
#               Chromium (Debian: apt-get install chromium, which .ci/run does as root);
#               screenshots of the index, the API reference and the performance page go
#               to VARGATHER_SCREENSHOTS (default docs/_build/screenshots)
#   slow        the tests marked slow, which the README's command leaves out (the
#               fork zoo at default settings, every mutant through the CLI, more
#               seeds and contracts of the gate, every compile scenario on every
#               backend), then the property files at 60 examples a property:
#               scheduled, not on every push
#   fuzz-smoke  each fuzz program replays the stored findings (fuzz/findings.py), then
#               spends half a minute on fresh randomness (new examples on every push);
#               what it finds goes to FUZZ_REPORT (default fuzz-report/) and its
#               example databases (.hypothesis/ci-fuzz-*), which CI uploads
#   fuzz        the same with FUZZ_MINUTES (default 10) of each fuzz program, example
#               databases under FUZZ_DB (default .hypothesis/fuzz), both run even if
#               one fails
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS="lint actionlint mypy tests docs browser slow fuzz-smoke fuzz"
start=$SECONDS
banner() { printf '\n=== %s (%ds) ===\n' "$1" $((SECONDS - start)); }

run_step() {
    local step=$1
    shift
    banner "$step"
    case "$step" in
    lint)
        ruff check .
        ruff format --check .
        ;;
    actionlint)
        actionlint .github/workflows/*.yml
        ;;
    mypy)
        mypy --strict vargather _vargather_pytestplugin.py
        ;;
    tests)
        python -m pytest -n 2 "$@"
        ;;
    docs)
        python -m sphinx -W --keep-going -n -q -b html docs docs/_build/html
        ;;
    browser)
        python -m pytest -p no:xdist --tb=short -m browser tests/test_docs_browser.py
        ;;
    slow)
        # inductor's vectorized kernels here (the default run compiles scalar ones)
        TORCHINDUCTOR_VEC_ISA_OK= python -m pytest -n 2 -m slow
        # the properties at three times the README command's examples (its profile: 20)
        python -m pytest -n 2 --max-examples 60 tests/test_properties.py \
            tests/test_family_properties.py tests/test_nan_semantics.py
        ;;
    fuzz-smoke)
        local report=${FUZZ_REPORT:-fuzz-report} status=0
        python fuzz/fuzz_stages.py --minutes 0.5 --db .hypothesis/ci-fuzz-stages \
            --report "$report/stages.txt" || status=1
        python fuzz/fuzz_multirank.py --minutes 0.5 --db .hypothesis/ci-fuzz-multirank \
            --report "$report/multirank.txt" || status=1
        return "$status"
        ;;
    fuzz)
        local minutes=${FUZZ_MINUTES:-10} db=${FUZZ_DB:-.hypothesis/fuzz} status=0
        local report=${FUZZ_REPORT:-fuzz-report}
        python fuzz/fuzz_stages.py --minutes "$minutes" --db "$db/stages" \
            --report "$report/stages.txt" || status=1
        python fuzz/fuzz_multirank.py --minutes "$minutes" --db "$db/multirank" \
            --report "$report/multirank.txt" || status=1
        return "$status"
        ;;
    *)
        echo "ci_steps.sh: unknown step '$step' (steps: $STEPS)" >&2
        return 2
        ;;
    esac
}

if [ $# -eq 0 ]; then
    echo "usage: scripts/ci_steps.sh STEP [STEP ...] | tests [PYTEST ARGS] | --list" >&2
    exit 2
fi
if [ "$1" = --list ]; then
    echo "$STEPS"
    exit 0
fi
if [ "$1" = tests ]; then
    shift
    run_step tests "$@"
else
    for step in "$@"; do
        run_step "$step"
    done
fi
banner "done: $*"
