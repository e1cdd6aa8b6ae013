-- The lake's catalog database and its two roles (docker-compose profile "lake").
-- Runs once, when the postgres volume is new (the image's /docker-entrypoint-initdb.d).
-- Passwords come from the environment the compose file passes (psql variables below).
\set projector_password `echo "$STEPLEDGER_LAKE_PROJECTOR_PASSWORD"`
\set analyst_password `echo "$STEPLEDGER_LAKE_ANALYST_PASSWORD"`
CREATE ROLE stepledger_projector LOGIN PASSWORD :'projector_password';
CREATE DATABASE stepledger_lake OWNER stepledger_projector;
-- Analysts read the catalog and write nothing: SELECT on every table the projector makes.
CREATE ROLE analyst LOGIN PASSWORD :'analyst_password';
\connect stepledger_lake
GRANT CONNECT ON DATABASE stepledger_lake TO analyst;
GRANT USAGE ON SCHEMA public TO analyst;
ALTER DEFAULT PRIVILEGES FOR ROLE stepledger_projector IN SCHEMA public
    GRANT SELECT ON TABLES TO analyst;
