-- The roles of a sidecar database (docs/postgres.md, "Roles"): an owner that
-- `sidecar migrate` connects as, a runtime role that `sidecar serve`
-- connects as, which can append and read but cannot alter the log, and a
-- retention role that retention connects as (serve --retention-store),
-- which can remove a finished run and nothing else.
-- Run once per database, as a superuser (or a role with CREATEROLE and CREATEDB):
--
--   psql -v ON_ERROR_STOP=1 -v owner=sidecar_owner -v runtime=sidecar -v retention=sidecar_retention \
--        -v database=sidecar -f roles.sql
--
-- then give each role a password (\password sidecar_owner) or a client certificate.
CREATE ROLE :"owner" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
CREATE ROLE :"runtime" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
CREATE ROLE :"retention" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
CREATE DATABASE :"database" OWNER :"owner";
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"database" TO :"runtime", :"retention";
\connect :"database"
ALTER SCHEMA public OWNER TO :"owner";
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"runtime", :"retention";
