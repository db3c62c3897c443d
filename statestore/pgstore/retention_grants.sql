-- What retention needs, granted to the retention role by `sidecar
-- migrate` after every migration (:"retention" is the role): it reads the
-- schema's version and the roles, and removes a finished run through
-- remove_run alone; it cannot read the log, nor insert, update, delete or
-- truncate anything itself.
GRANT SELECT ON schema_migrations, runtime_role, retention_role TO :"retention";
GRANT EXECUTE ON FUNCTION remove_run(text, bigint, bigint) TO :"retention";
