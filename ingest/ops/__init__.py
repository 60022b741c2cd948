"""Operations around the batch: replay, reset, maintenance and the reports (status, history, verify)."""
