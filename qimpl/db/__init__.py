"""PostgreSQL storage: migrations, connections and the run repository."""
