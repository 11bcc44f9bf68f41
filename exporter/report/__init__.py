"""Reports: the console tables, the HTML report, its charts and plots."""
