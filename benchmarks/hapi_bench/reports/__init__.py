"""Results: the JSON records of the testbed's cells, their markdown tables and plots."""
