"""How large a cache to give each table: hit-rate curves from the data and the planner that splits a memory budget."""
