"""The one tuning stack: settings schema to tuner dataclasses (`schema`), the planning workload's
protocol (`workload`) and the builder every mode calls (`build`)."""
