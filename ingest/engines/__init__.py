"""Engines: how a planned batch's ranges become data files (the Engine port): locally, or on Spark."""
