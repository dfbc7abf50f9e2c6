"""The EM data pass: chunks and runners, the fixed combine order, the finite guard, the compute kernel choice."""
