"""Never returns.
EXPECT screen=TIMEOUT runtime=TIMEOUT"""


def run(hidden_states, weight):
    n = 0
    while True:
        n += 1
