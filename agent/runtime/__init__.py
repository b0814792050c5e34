"""The agent's runtime: the HTTP app and scheduler (`app`), the whole agent assembled from
settings (`assembly`), and the bridge between the collected signals and the tuner."""
