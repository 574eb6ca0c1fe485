a:
a:
    end
