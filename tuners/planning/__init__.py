"""Planning live changes that pay for themselves: the transition planner, its twin of the recent workload, the regime horizon and the capacity candidates."""
