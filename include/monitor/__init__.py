"""The run monitor's backend: what a run's files say (runs), Airflow's states in its UI's words
(states), and the page (page), for the plugin in plugins/regen_monitor.py."""
