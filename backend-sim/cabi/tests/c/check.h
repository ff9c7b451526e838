/* The checks of the C test programs: each prints "ok   <condition>" or "FAIL
 * <condition> (errno N): <why>" and counts the failures. */
#include <errno.h>
#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (cond) {                                                    \
			printf("ok   %s\n", #cond);                            \
		} else {                                                       \
			printf("FAIL %s (errno %d): ", #cond, errno);          \
			printf(__VA_ARGS__);                                   \
			printf("\n");                                          \
			failures++;                                            \
		}                                                              \
	} while (0)
