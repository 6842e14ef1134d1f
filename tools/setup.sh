#!/usr/bin/env bash
# Set-up for every Makefile target: idempotent, and fast (well under 2 s) when already done.
#
#   1. checks prerequisites: Python >= 3.11, Java >= 17 (Maven only when jars must be resolved)
#   2. .venv with the project installed editable with the dev, spark and demo extras
#      (re-run when pyproject.toml changes; stamped in .venv/.mqgw-setup-stamp)
#   3. Debian's mosquitto, mosquitto-clients, chromium and chromium-driver, installed with
#      apt-get when missing (needs root)
#   4. the Kafka broker jars (tools/jvm/kafka/pom.xml) and the Spark Kafka connector jars
#      (tools/jvm/spark-kafka/pom.xml, at exactly the installed pyspark's version), resolved
#      with mvn into .cache/jvm/<name>/lib, skipped when the stamp matches the pom's hash.
#
# Environment: MQGW_PYTHON (interpreter for the venv, default: python3.11, then python3),
#              MQGW_SKIP_APT=1 (never call apt-get; fail instead when one of them is missing).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
CACHE="$ROOT/.cache"
JVM_CACHE="$CACHE/jvm"
M2="$CACHE/m2"
DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

sha256_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# --- 1. prerequisites -------------------------------------------------------------------
find_python() {
    local cand
    for cand in "${MQGW_PYTHON:-}" python3.11 python3.12 python3.13 python3; do
        [[ -n "$cand" ]] || continue
        if command -v "$cand" >/dev/null 2>&1 &&
            "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
            command -v "$cand"
            return 0
        fi
    done
    return 1
}

check_java() {
    command -v java >/dev/null 2>&1 ||
        die "java not found on PATH: install OpenJDK 17 or newer (Debian: apt-get install -y openjdk-17-jdk-headless)"
    local line major
    line="$(java -version 2>&1 | head -n1)"
    major="$(sed -E 's/.*version "([0-9]+)(\.[0-9]+)?.*/\1/' <<<"$line")"
    [[ "$major" =~ ^[0-9]+$ ]] || die "cannot read the Java version from: $line"
    if [[ "$major" == 1 ]]; then major=8; fi
    ((major >= 17)) || die "Java $major found ($line); Kafka 4.x and Spark 4.x need Java 17 or newer"
}

check_mvn() {
    command -v mvn >/dev/null 2>&1 ||
        die "mvn not found on PATH: install Maven 3.8+ (Debian: apt-get install -y maven); it resolves the Kafka and Spark connector jars"
}

check_java

# --- 2. virtual environment -------------------------------------------------------------
# The editable install maps each top-level package it saw, so a package added later
# (analytics/, ...) needs a reinstall: the stamp covers the list of them too.
venv_stamp="$( (cat pyproject.toml tools/setup.sh; ls -d -- */__init__.py 2>/dev/null) | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" ]]; then
    py="$(find_python)" || die "Python 3.11 or newer not found (tried MQGW_PYTHON, python3.11, python3.12, python3.13, python3)"
    say "creating .venv with $py ($("$py" --version 2>&1))"
    "$py" -m venv "$VENV" || die "python -m venv failed (Debian: apt-get install -y python3-venv)"
fi
"$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' ||
    die ".venv uses $("$VENV/bin/python" --version 2>&1); this project needs Python 3.11+: remove .venv and re-run"
if [[ "$(cat "$VENV/.mqgw-setup-stamp" 2>/dev/null)" != "$venv_stamp" || ! -x "$VENV/bin/mqgw" ]]; then
    say "installing the project into .venv (editable, extras dev+spark+demo; first time takes a few minutes: pyspark is large)"
    pip_log="$VENV/mqgw-pip-install.log"
    if ! { "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip &&
        "$VENV/bin/python" -m pip install --disable-pip-version-check -e ".[dev,spark,demo]"; } >"$pip_log" 2>&1; then
        tail -n 30 "$pip_log" >&2
        die "pip install failed (full log: $pip_log)"
    fi
    printf '%s\n' "$venv_stamp" >"$VENV/.mqgw-setup-stamp"
else
    say ".venv up to date"
fi

# --- 3. mosquitto -----------------------------------------------------------------------
find_mosquitto() {
    local cand
    for cand in "${MQGW_MOSQUITTO:-}" "$(command -v mosquitto 2>/dev/null || true)" /usr/sbin/mosquitto /usr/local/sbin/mosquitto; do
        if [[ -n "$cand" && -x "$cand" ]]; then
            printf '%s\n' "$cand"
            return 0
        fi
    done
    return 1
}
# mosquitto-clients (mosquitto_pub/mosquitto_sub): the tests drive the gateway from outside.
# chromium + chromium-driver: the dashboard's browser test (tests/browser/) drives the
# system's headless Chromium with Selenium; nothing downloads a browser of its own.
missing=()
mosq="$(find_mosquitto)" || missing+=(mosquitto)
command -v mosquitto_pub >/dev/null 2>&1 || missing+=(mosquitto-clients)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [[ ${#missing[@]} == 0 ]]; then
    say "mosquitto present ($mosq), with mosquitto-clients; chromium and chromium-driver present"
else
    [[ "${MQGW_SKIP_APT:-0}" != 1 ]] || die "${missing[*]} not found and MQGW_SKIP_APT=1: install Debian's ${missing[*]} packages"
    [[ "$(id -u)" == 0 ]] ||
        die "${missing[*]} not found and not running as root: run 'sudo apt-get update && sudo apt-get install -y ${missing[*]}' (or set MQGW_MOSQUITTO to mosquitto's path), then re-run"
    command -v apt-get >/dev/null 2>&1 || die "${missing[*]} not found and apt-get unavailable: install mosquitto 2.x (and its clients), chromium and chromium-driver (set MQGW_MOSQUITTO for mosquitto)"
    say "installing ${missing[*]}: apt-get update && apt-get install -y ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null || die "apt-get update failed"
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
    mosq="$(find_mosquitto)" || die "mosquitto installed but its binary was not found"
    command -v chromedriver >/dev/null 2>&1 || die "chromium-driver installed but chromedriver was not found on PATH"
    say "installed ${missing[*]} (mosquitto: $mosq)"
fi

# --- 4. JVM jars --------------------------------------------------------------------------
# resolve NAME POM STAMP [extra mvn args...]: copy the pom's runtime dependencies into
# .cache/jvm/NAME/lib unless .cache/jvm/NAME/stamp already says STAMP. The copy goes to a
# scratch directory first so an interrupted run never leaves a half-filled lib/ behind.
resolve_jars() {
    local name="$1" pom="$2" stamp="$3"
    shift 3
    local dest="$JVM_CACHE/$name"
    if [[ -f "$dest/stamp" && "$(head -n1 "$dest/stamp")" == "$stamp" ]] && compgen -G "$dest/lib/*.jar" >/dev/null; then
        say "$name jars up to date (.cache/jvm/$name/lib)"
        return 0
    fi
    check_mvn
    say "resolving $name jars from $pom with mvn (first time downloads from Maven Central)"
    local scratch="$JVM_CACHE/.$name.partial"
    rm -rf "$scratch"
    mkdir -p "$scratch/lib" "$M2"
    if ! mvn -B -q -f "$ROOT/$pom" -Dmaven.repo.local="$M2" "$@" \
        "$DEP_PLUGIN:copy-dependencies" -DoutputDirectory="$scratch/lib" -DincludeScope=runtime \
        >"$scratch/mvn.log" 2>&1; then
        tail -n 30 "$scratch/mvn.log" >&2
        die "mvn could not resolve $pom (full log: $scratch/mvn.log)${RESOLVE_HINT:+. $RESOLVE_HINT}"
    fi
    compgen -G "$scratch/lib/*.jar" >/dev/null || die "mvn resolved no jars for $pom (log: $scratch/mvn.log)"
    printf '%s\n' "$stamp" >"$scratch/stamp"
    rm -rf "$dest"
    mv "$scratch" "$dest"
    say "$name: $(find "$dest/lib" -name '*.jar' | wc -l) jars in .cache/jvm/$name/lib"
}

resolve_jars kafka tools/jvm/kafka/pom.xml "$(sha256_of tools/jvm/kafka/pom.xml)"

# The connector must be built for exactly the installed Spark: read pyspark's version from
# the venv's metadata (fast: no pyspark import) and pass it to Maven.
spark_version="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("pyspark"))' 2>/dev/null)" ||
    die "pyspark is not installed in .venv (the spark extra): remove .venv/.mqgw-setup-stamp and re-run"
spark_stamp="$(sha256_of tools/jvm/spark-kafka/pom.xml)-spark-$spark_version"
RESOLVE_HINT="The Spark Kafka connector must match pyspark $spark_version exactly; if Maven Central has no complete connector set for that version, pin pyspark in pyproject.toml (extra 'spark') to one that has (docs/devstack.md)" \
    resolve_jars spark-kafka tools/jvm/spark-kafka/pom.xml "$spark_stamp" \
    -Dspark.version="$spark_version" \
    -DincludeArtifactIds=spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2
n_connector="$(find "$JVM_CACHE/spark-kafka/lib" -name '*.jar' | wc -l)"
[[ "$n_connector" == 4 ]] ||
    die "expected 4 Spark Kafka connector jars in .cache/jvm/spark-kafka/lib, found $n_connector: check tools/jvm/spark-kafka/pom.xml"
say "done"
