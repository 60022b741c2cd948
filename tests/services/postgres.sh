#!/usr/bin/env bash
# Install, start and prepare the PostgreSQL server the integration suite's catalogs use.
#
# Idempotent: on a machine where it already ran, it only starts the cluster if it is down.
# Needs root (apt-get, pg_hba.conf). Result: postgres at 127.0.0.1:5432, user `postgres` with
# trust on loopback only (tests carry no password), database `test` — the default of
# INGEST_TEST_POSTGRES_URI in tests/integration/conftest.py.
set -euo pipefail

if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null; then
  echo "postgres.sh: installing Debian's postgresql package"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

version="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
if ! pg_lsclusters -h | awk '{print $1 " " $2}' | grep -qx "$version main"; then
  pg_createcluster "$version" main >/dev/null
fi

# pg_hba.conf is first-match: the trust lines go before Debian's scram-sha-256 lines for TCP.
hba="/etc/postgresql/$version/main/pg_hba.conf"
marker='# lakehouse-ingest tests: trust on loopback'
if ! grep -qF "$marker" "$hba"; then
  {
    echo "$marker"
    echo 'host    all    postgres    127.0.0.1/32    trust'
    echo 'host    all    postgres    ::1/128         trust'
    cat "$hba"
  } >"$hba.new"
  chown --reference="$hba" "$hba.new"
  chmod --reference="$hba" "$hba.new"
  mv "$hba.new" "$hba"
  changed=1
fi

if pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $4}' | grep -q online; then
  if [ "${changed:-0}" = 1 ]; then pg_ctlcluster --skip-systemctl-redirect "$version" main reload; fi
else
  pg_ctlcluster --skip-systemctl-redirect "$version" main start
fi

for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p 5432 && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p 5432

if [ "$(psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'")" != 1 ]; then
  psql -h 127.0.0.1 -U postgres -qc 'CREATE DATABASE test'
fi
echo "postgres.sh: PostgreSQL $version ready at 127.0.0.1:5432, database test"
